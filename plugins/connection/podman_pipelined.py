# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``hami.node.podman_pipelined``: containers.podman's ``podman`` connection with Ansible pipelining.

Why a plugin: ``containers.podman.podman`` sets ``has_pipelining = False`` and runs ``podman exec``
without ``-i``, so every module costs a ``podman mount``, a temporary directory, a file copy, a ``chmod``,
the run and a clean-up: four to five ``podman`` invocations of ~0.2 s each. Here a module is piped to
the container's Python on stdin (``podman exec -i``), as ``ssh`` with ``pipelining = True`` does for real
nodes: one invocation per task. ``copy``/``template`` still copy files, through the container's mount
point taken on first use. Measured on the test image: a ten-task play 19 s -> 11-12 s.

A container that is stopped or gone is reported as UNREACHABLE (AnsibleConnectionFailure), as ssh reports
a node that is down: containers.podman's plugin returns podman's exit code 125 as the module's failure, so
a stopped sandbox node showed as FAILED and site.yml could not tell a dead node from a failing task.
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: podman_pipelined
    short_description: Run tasks in an existing podman container, with pipelining
    description:
      - The C(containers.podman.podman) connection, but modules are piped to the container's Python over
        C(podman exec -i) (Ansible pipelining) instead of copied to a temporary directory and run.
      - Used by this collection's sandbox and molecule scenarios, whose nodes are podman containers.
        Real nodes are reached over ssh; set C(pipelining = True) there for the same effect.
      - Needs the C(containers.podman) collection (bundled with the C(ansible) package).
    author: hami.node developers
    options:
      remote_addr:
        description:
          - The ID or name of the container.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description:
          - User (name or UID) that runs commands inside the container.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description:
          - Extra arguments to pass to the podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description:
          - Executable for podman command.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
"""

import re  # noqa: E402 - Ansible reads DOCUMENTATION first
import shlex  # noqa: E402

from ansible.errors import AnsibleConnectionFailure, AnsibleError  # noqa: E402
from ansible.module_utils.common.text.converters import to_native  # noqa: E402
from ansible.plugins.connection import ConnectionBase, ensure_connect  # noqa: E402

try:
    from ansible_collections.containers.podman.plugins.connection.podman import Connection as _Podman
except ImportError as exc:  # pragma: no cover - depends on the controller's collections
    raise AnsibleError("hami.node.podman_pipelined needs the containers.podman collection "
                       "(ansible-galaxy collection install containers.podman)") from exc


# what `podman exec` (exit 125) prints when the container is not there to run anything in
_DOWN = re.compile(rb"no such container|no container with name or ID|container state improper|"
                   rb"can only create exec sessions on running containers|is not running", re.IGNORECASE)
PODMAN_ERROR = 125


def down(rc, stderr):
    """The container is stopped or gone (podman could not even start the command)."""
    return rc == PODMAN_ERROR and bool(_DOWN.search(stderr or b""))


class Connection(_Podman):
    transport = "hami.node.podman_pipelined"
    has_pipelining = True
    always_pipeline_modules = True  # the whole point: no ANSIBLE_PIPELINING setting needed

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mount_tried = False

    def _connect(self):
        # no `podman mount` here: most tasks only run a module; files mount on first use below
        ConnectionBase._connect(self)
        self._connected = True
        return self

    def _mount_once(self):
        if not self._mount_tried:
            self._mount_tried = True
            _Podman._connect(self)  # sets self._mount_point, or leaves None: `podman cp` then

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec", "-i"] if in_data is not None else ["exec"]
        if self.user:
            args += ["--user", self.user]
        argv = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        rc, stdout, stderr = self._podman(args, argv, in_data)
        if down(rc, stderr):
            raise AnsibleConnectionFailure("container %s is not running: %s"
                                           % (self._container_id, to_native(stderr).strip()[-300:]))
        return rc, stdout, stderr

    def put_file(self, in_path, out_path):
        self._mount_once()
        return super().put_file(in_path, out_path)

    def fetch_file(self, in_path, out_path):
        self._mount_once()
        return super().fetch_file(in_path, out_path)
