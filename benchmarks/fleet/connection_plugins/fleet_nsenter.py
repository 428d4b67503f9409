# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``fleet_nsenter``: the fleet benchmark's connection to its light hosts (not part of the collection).

The collection's ``hami.node.podman_pipelined`` runs ``podman exec -i`` per task: a Go client that opens
the container store, asks conmon and runc for an exec session, ~0.1-0.2 s of CPU on the controller each
time. At 100 hosts x ~100 tasks that is most of what a converged run costs on this machine, and none of it
exists on a real fleet (ssh with ControlPersist costs a few milliseconds). This plugin enters the same
container's namespaces with ``nsenter`` (a small C program) instead: the module runs in the container's
mount, UTS, IPC, network and PID namespaces, with its root, its environment and -- so the benchmark can
charge it to the host -- its cgroups, piped to the container's Python as with pipelining over ssh.

The container's PID, environment and cgroup paths come from a map the benchmark writes once
(``$HAMI_FLEETBENCH_NSENTER_MAP``, JSON ``{name: {pid, env, cgroups: [path, ...]}}``): a worker process
per task must not ask podman.
"""

from __future__ import annotations

DOCUMENTATION = r"""
    name: fleet_nsenter
    short_description: Run tasks in a running container by entering its namespaces (benchmark only)
    description:
      - Pipelined module execution in a podman container through nsenter, for the fleet benchmark.
    author: hami.node developers
    options:
      remote_addr:
        description: The container's name (a key of the map).
        default: inventory_hostname
        vars:
          - name: inventory_hostname
          - name: ansible_host
"""

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402

from ansible.errors import AnsibleConnectionFailure, AnsibleError  # noqa: E402
from ansible.module_utils.common.text.converters import to_bytes, to_native  # noqa: E402
from ansible.plugins.connection import ConnectionBase  # noqa: E402

_MAP_CACHE = {}


def _target(name):
    path = os.environ.get("HAMI_FLEETBENCH_NSENTER_MAP", "")
    if not path:
        raise AnsibleError(
            "fleet_nsenter: HAMI_FLEETBENCH_NSENTER_MAP is not set (the fleet benchmark sets it)"
        )
    if path not in _MAP_CACHE:
        with open(path) as fh:
            _MAP_CACHE[path] = json.load(fh)
    try:
        return _MAP_CACHE[path][name]
    except KeyError:
        raise AnsibleConnectionFailure("fleet_nsenter: no container %s in %s" % (name, path)) from None


def _join_cgroups(paths):
    def join():
        pid = str(os.getpid())
        for p in paths:
            try:
                with open(os.path.join(p, "cgroup.procs"), "w") as fh:
                    fh.write(pid)
            except OSError:
                pass  # accounting only: the command runs either way

    return join


class Connection(ConnectionBase):
    transport = "fleet_nsenter"
    has_pipelining = True
    always_pipeline_modules = True
    default_user = "root"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.environ.get("HAMI_FLEETBENCH_NO_PIPELINING"):  # the benchmark's `nopipe` variant
            self.has_pipelining = False
            self.always_pipeline_modules = False

    def _connect(self):
        if not self._connected:
            self._t = _target(self.get_option("remote_addr"))
            self._connected = True
        return self

    def _argv(self, argv):
        t = self._t
        return ["nsenter", "-t", str(t["pid"]), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"] + argv

    def _run(self, argv, in_data=None, stdin=None):
        self._connect()
        try:
            p = subprocess.Popen(
                self._argv(argv),
                stdin=stdin if stdin is not None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._t["env"],
                # Ansible's worker processes run one thread
                preexec_fn=_join_cgroups(self._t.get("cgroups") or []),  # noqa: PLW1509
            )
        except OSError as exc:
            raise AnsibleConnectionFailure("fleet_nsenter: cannot run nsenter: %s" % exc) from None
        out, err = p.communicate(in_data)
        return p.returncode, out, err

    def exec_command(self, cmd, in_data=None, sudoable=False):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        return self._run(shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as fh:
            rc, _, err = self._run(["/bin/sh", "-c", 'cat > "$1"', "sh", out_path], stdin=fh)
        if rc != 0:
            raise AnsibleError(
                "fleet_nsenter: failed to put %s to %s: %s" % (in_path, out_path, to_native(err))
            )

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        rc, out, err = self._run(["cat", in_path], in_data=b"")
        if rc != 0:
            raise AnsibleError("fleet_nsenter: failed to fetch %s: %s" % (in_path, to_native(err)))
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as fh:
            fh.write(out)

    def close(self):
        self._connected = False
