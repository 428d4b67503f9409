#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: hami_agent_install
short_description: Install hami-agent into its virtualenv from a wheelhouse archive on the node, offline
version_added: 0.1.0
author:
  - hami.node developers
description:
  - One call for what the C(hami.node.hami_agent) role did in eight tasks. It unpacks the wheelhouse
    archive, creates the venv without ensurepip, bootstraps pip from the pip wheel, runs
    C(pip install --no-index --upgrade --upgrade-strategy eager), and checks that
    C(hami-agent version --json) runs.
  - Converged fast path. The venv keeps the SHA-256 of the archive it was installed from
    (C(<venv>/.hami-wheelhouse.sha256), written last, after the version check). When that digest matches the
    archive and O(force) is false, the module only runs the version check and returns C(changed=false).
  - The wheels are unpacked one by one through a temp file and a rename, and wheels of an earlier archive
    are removed (pip would prefer a stale newer one). pip installs in place, as the role's tasks did before.
    A run that fails part way writes no digest, so the next run installs again.
  - Every command has a timeout (O(timeout)). A failure names its step (C(step) in the result) and gives the
    command's output.
options:
  archive:
    description:
      - The wheelhouse tar on the node (the role copies it there). It holds only C(*.whl) files at its top.
    type: path
    required: true
  wheelhouse:
    description: The directory the archive is unpacked into; pip's C(--find-links).
    type: path
    required: true
  venv:
    description: The agent's virtualenv.
    type: path
    required: true
  python:
    description: The interpreter that creates the venv.
    type: str
    default: python3
  package:
    description: The project to install from the wheelhouse.
    type: str
    default: hami-agent
  force:
    description:
      - Reinstall O(package) even when pip sees its version installed already. The role sets it when
        the archive's copy changed, because a rebuilt wheel with an unchanged version number is no
        upgrade for pip.
      - A digest from an earlier archive forces the reinstall too, for example after a run that failed
        part way.
    type: bool
    default: false
  timeout:
    description: Seconds each command (venv, pip, version check) may take.
    type: float
    default: 600
extends_documentation_fragment:
  - hami.node.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether an install would run, and runs nothing.
  diff_mode:
    support: none
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Install the agent from the copied wheelhouse
  hami.node.hami_agent_install:
    archive: /opt/hami-agent/wheelhouse.tar
    wheelhouse: /opt/hami-agent/wheelhouse
    venv: /opt/hami-agent/venv
    force: "{{ wheelhouse_copy is changed }}"
"""

RETURN = r"""
version:
  description: What C(hami-agent version --json) printed (not in check mode).
  returned: success
  type: dict
  sample: {"version": "0.1.0"}
steps:
  description: The steps that ran, in order.
  returned: always
  type: list
  elements: str
  sample: ["unpack", "venv", "pip bootstrap", "pip install", "reinstall", "version check"]
digest:
  description: SHA-256 of the archive.
  returned: when the archive exists
  type: str
step:
  description: The step that failed.
  returned: failure
  type: str
"""

import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _wheelhouse  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils._nvidia_smi import SmiTimeout, run_bounded  # noqa: E402


class Installer:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.result = {"changed": False, "steps": []}

    def fail(self, step, msg, **extra):
        self.module.fail_json(
            msg="hami_agent_install, step %s: %s" % (step, msg), step=step, **extra, **self.result
        )

    def run(self, step, argv):
        """Run one command of a step; fail naming the step when it fails or outlives the timeout."""
        self.result["steps"].append(step)
        try:
            res = run_bounded(argv, self.p["timeout"])
        except SmiTimeout:
            self.fail(
                step,
                "%s did not finish within %gs (the timeout option)" % (" ".join(argv), self.p["timeout"]),
            )
        except OSError as exc:
            self.fail(step, "%s could not run: %s" % (argv[0], exc))
        if res.rc != 0:
            self.fail(
                step,
                "%s failed (rc %d): %s" % (" ".join(argv), res.rc, (res.err or res.out).strip()[-2000:]),
                rc=res.rc,
                stdout=res.out,
                stderr=res.err,
            )
        return res

    def version(self):
        res = self.run(
            "version check", [os.path.join(self.p["venv"], "bin", "hami-agent"), "version", "--json"]
        )
        try:
            return json.loads(res.out)
        except ValueError:
            self.fail("version check", "hami-agent version --json printed no JSON: %r" % res.out[:200])

    def install(self, stamp, digest):
        p = self.p
        venv_bin = os.path.join(p["venv"], "bin")
        self.result["steps"].append("unpack")
        try:
            wheels = _wheelhouse.unpack(p["archive"], p["wheelhouse"])
        except (_wheelhouse.WheelhouseError, OSError) as exc:
            self.fail("unpack", str(exc))
        pip_whl = _wheelhouse.pip_wheel(wheels)
        if pip_whl is None:
            self.fail(
                "unpack",
                "the wheelhouse has no pip wheel: the venv is created without ensurepip "
                "(python3-venv is often not installed), so pip is bootstrapped from the wheelhouse. "
                "Add it: pip download pip -d <wheelhouse>",
            )
        if not _wheelhouse.wheel_versions(wheels, p["package"]):
            self.fail(
                "unpack",
                "the wheelhouse has no %s wheel: build it into the wheelhouse (pip wheel -w <dir> "
                "<agent source>)" % p["package"],
            )
        # --without-pip: Debian/Ubuntu ship ensurepip in python3-venv, which minimal nodes lack
        if not os.path.exists(os.path.join(venv_bin, "python")):
            self.run("venv", [p["python"], "-m", "venv", "--without-pip", p["venv"]])
            self.result["changed"] = True
        if not os.path.exists(os.path.join(venv_bin, "pip")):
            self.run(
                "pip bootstrap",
                [
                    os.path.join(venv_bin, "python"),
                    os.path.join(p["wheelhouse"], pip_whl, "pip"),
                    "install",
                    "--quiet",
                    "--no-index",
                    "--find-links",
                    p["wheelhouse"],
                    "pip",
                ],
            )
            self.result["changed"] = True
        pip = [
            os.path.join(venv_bin, "pip"),
            "install",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            p["wheelhouse"],
        ]
        res = self.run("pip install", pip + ["--upgrade", "--upgrade-strategy", "eager", p["package"]])
        if "Successfully installed" in res.out:
            self.result["changed"] = True
        # A rebuilt wheel of an unchanged version number is not an upgrade for pip: reinstall it explicitly.
        if p["force"] or (stamp is not None and stamp != digest):
            self.run("reinstall", pip + ["--force-reinstall", "--no-deps", p["package"]])
            self.result["changed"] = True
        version = self.version()
        expected = _wheelhouse.wheel_versions(wheels, p["package"])
        if str(version.get("version")) not in expected:
            self.fail(
                "version check",
                "hami-agent reports version %s, the wheelhouse has %s: is another hami-agent "
                "first on the venv's path?" % (version.get("version"), ", ".join(expected)),
            )
        _wheelhouse.write_stamp(p["venv"], digest)
        return version

    def main(self):
        p = self.p
        if not os.path.isfile(p["archive"]):
            if self.module.check_mode:  # the copy before this task did not run in check mode either
                self.module.exit_json(
                    **dict(self.result, changed=True, msg="%s is not on the node yet" % p["archive"])
                )
            self.fail(
                "unpack", "%s does not exist: copy the wheelhouse archive to the node first" % p["archive"]
            )
        digest = _wheelhouse.sha256_of(p["archive"])
        self.result["digest"] = digest
        stamp = _wheelhouse.read_stamp(p["venv"])
        converged = (
            not p["force"]
            and stamp == digest
            and os.path.exists(os.path.join(p["venv"], "bin", "hami-agent"))
        )
        if self.module.check_mode:
            self.module.exit_json(**dict(self.result, changed=not converged))
        version = self.version() if converged else self.install(stamp, digest)
        self.module.exit_json(version=version, **self.result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            archive=dict(type="path", required=True),
            wheelhouse=dict(type="path", required=True),
            venv=dict(type="path", required=True),
            python=dict(type="str", default="python3"),
            package=dict(type="str", default="hami-agent"),
            force=dict(type="bool", default=False),
            timeout=dict(type="float", default=600.0),
        ),
        supports_check_mode=True,
    )
    Installer(module).main()


if __name__ == "__main__":
    main()
