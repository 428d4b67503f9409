"""hami.node.hami_agent_install: every branch, a temp dir and a fake command runner (no pip, no network)."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from ansible_collections.hami.node.plugins.module_utils import _wheelhouse
from ansible_collections.hami.node.plugins.module_utils._nvidia_smi import SmiResult, SmiTimeout
from ansible_collections.hami.node.plugins.modules import hami_agent_install

from tests.unit.plugins.moduletest import run_module

pytestmark = pytest.mark.unit

WHEELS = ["hami_agent-0.1.0-py3-none-any.whl", "pip-24.0-py3-none-any.whl", "pyyaml-6.0-py3-none-any.whl"]


def make_archive(path, names=WHEELS, content=b"wheel"):
    with tarfile.open(path, "w") as tar:
        for name in names:
            info = tarfile.TarInfo("./" + name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


class FakeNode:
    """Plays venv, pip and hami-agent: each call leaves what the real command leaves, and is recorded."""

    def __init__(self, venv, version="0.1.0"):
        self.venv = venv
        self.version = version
        self.calls = []
        self.fail_step = None
        self.hang = None
        self.pip_output = "Successfully installed hami-agent-0.1.0"

    def __call__(self, argv, timeout_s, env=None, data=None):
        step = self.step_of(argv)
        self.calls.append(step)
        if self.hang == step:
            raise SmiTimeout(argv, timeout_s)
        if self.fail_step == step:
            return SmiResult(argv, 1, "", "boom in " + step)
        bin_dir = os.path.join(self.venv, "bin")
        if step == "venv":
            os.makedirs(bin_dir)
            open(os.path.join(bin_dir, "python"), "w").close()
        elif step == "pip bootstrap":
            open(os.path.join(bin_dir, "pip"), "w").close()
        elif step in ("pip install", "reinstall"):
            open(os.path.join(bin_dir, "hami-agent"), "w").close()
            return SmiResult(argv, 0, self.pip_output if step == "pip install" else "", "")
        elif step == "version check":
            return SmiResult(argv, 0, json.dumps({"version": self.version}), "")
        return SmiResult(argv, 0, "", "")

    @staticmethod
    def step_of(argv):
        if argv[1:3] == ["-m", "venv"]:
            return "venv"
        if argv[-1] == "pip" and argv[1].endswith("/pip"):
            return "pip bootstrap"
        if "--force-reinstall" in argv:
            return "reinstall"
        if argv[1] == "install":
            return "pip install"
        return "version check"


@pytest.fixture
def node(tmp_path, monkeypatch):
    prefix = tmp_path / "opt"
    prefix.mkdir()
    make_archive(prefix / "wheelhouse.tar")
    fake = FakeNode(str(prefix / "venv"))
    monkeypatch.setattr(hami_agent_install, "run_bounded", fake)
    args = {
        "archive": str(prefix / "wheelhouse.tar"),
        "wheelhouse": str(prefix / "wheelhouse"),
        "venv": str(prefix / "venv"),
        "timeout": 5,
    }
    return fake, args, prefix


def install(args, monkeypatch, **kw):
    return run_module(hami_agent_install.main, args, monkeypatch, **kw)


def test_fresh_node_installs_everything_and_stamps(node, monkeypatch):
    fake, args, prefix = node
    r = install(args, monkeypatch)
    assert r["changed"] is True and not r.get("failed")
    assert fake.calls == ["venv", "pip bootstrap", "pip install", "version check"]
    assert r["version"] == {"version": "0.1.0"}
    assert sorted(os.listdir(prefix / "wheelhouse")) == sorted(WHEELS)
    assert _wheelhouse.read_stamp(args["venv"]) == _wheelhouse.sha256_of(args["archive"])
    # no temporary directory of the swap is left behind
    assert sorted(os.listdir(prefix)) == ["venv", "wheelhouse", "wheelhouse.tar"]


def test_wheels_of_an_earlier_archive_are_removed(node, monkeypatch):
    fake, args, prefix = node
    install(args, monkeypatch)
    newer = ["hami_agent-0.2.0-py3-none-any.whl"] + WHEELS[1:]
    make_archive(prefix / "wheelhouse.tar", names=newer)
    fake.version = "0.2.0"
    r = install(dict(args, force=True), monkeypatch)
    assert r["changed"] is True
    assert sorted(os.listdir(prefix / "wheelhouse")) == sorted(newer)


def test_converged_runs_only_the_version_check(node, monkeypatch):
    fake, args, _ = node
    install(args, monkeypatch)
    fake.calls.clear()
    r = install(args, monkeypatch)
    assert r["changed"] is False
    assert fake.calls == ["version check"] and r["steps"] == ["version check"]


def test_force_reinstalls_a_rebuilt_wheel_of_the_same_version(node, monkeypatch):
    fake, args, _ = node
    install(args, monkeypatch)
    fake.calls.clear()
    fake.pip_output = "Requirement already satisfied: hami-agent"
    r = install(dict(args, force=True), monkeypatch)
    assert r["changed"] is True
    assert fake.calls == ["pip install", "reinstall", "version check"]


def test_a_new_archive_after_a_failed_run_is_reinstalled(node, monkeypatch):
    fake, args, prefix = node
    install(args, monkeypatch)
    make_archive(prefix / "wheelhouse.tar", content=b"rebuilt")
    fake.calls.clear()
    fake.pip_output = "Requirement already satisfied: hami-agent"
    r = install(args, monkeypatch)  # force false: the copy that changed it ran in an earlier, failed run
    assert r["changed"] is True and "reinstall" in fake.calls
    assert _wheelhouse.read_stamp(args["venv"]) == _wheelhouse.sha256_of(args["archive"])


def test_an_install_without_a_stamp_and_nothing_new_is_unchanged(node, monkeypatch):
    """A node installed by the role's earlier tasks (no digest yet): pip has nothing to do, no restart."""
    fake, args, _ = node
    install(args, monkeypatch)
    os.unlink(os.path.join(args["venv"], _wheelhouse.STAMP))
    fake.calls.clear()
    fake.pip_output = "Requirement already satisfied: hami-agent"
    r = install(args, monkeypatch)
    assert r["changed"] is False
    assert fake.calls == ["pip install", "version check"]
    assert _wheelhouse.read_stamp(args["venv"]) is not None


@pytest.mark.parametrize("step", ["venv", "pip bootstrap", "pip install", "version check"])
def test_a_failed_step_is_named_and_leaves_no_stamp(node, monkeypatch, step):
    fake, args, _ = node
    fake.fail_step = step
    r = install(args, monkeypatch)
    assert r["failed"] and r["step"] == step
    assert "step %s" % step in r["msg"] and "boom in " + step in r["msg"]
    assert _wheelhouse.read_stamp(args["venv"]) is None


def test_a_hung_command_fails_naming_the_timeout(node, monkeypatch):
    fake, args, _ = node
    fake.hang = "pip install"
    r = install(args, monkeypatch)
    assert r["failed"] and r["step"] == "pip install"
    assert "within 5s" in r["msg"] and "timeout" in r["msg"]


def test_wrong_version_after_install_is_refused(node, monkeypatch):
    fake, args, _ = node
    fake.version = "0.0.9"
    r = install(args, monkeypatch)
    assert r["failed"] and r["step"] == "version check"
    assert "0.0.9" in r["msg"] and "0.1.0" in r["msg"]
    assert _wheelhouse.read_stamp(args["venv"]) is None


def test_no_pip_wheel_is_refused_with_the_fix(node, monkeypatch):
    fake, args, prefix = node
    make_archive(prefix / "wheelhouse.tar", names=[WHEELS[0]])
    r = install(args, monkeypatch)
    assert r["failed"] and r["step"] == "unpack"
    assert "pip download pip -d" in r["msg"] and fake.calls == []


def test_no_agent_wheel_is_refused(node, monkeypatch):
    fake, args, prefix = node
    make_archive(prefix / "wheelhouse.tar", names=WHEELS[1:])
    r = install(args, monkeypatch)
    assert r["failed"] and "no hami-agent wheel" in r["msg"] and fake.calls == []


@pytest.mark.parametrize("name", ["../evil.whl", "sub/dir.whl", "notes.txt"])
def test_an_archive_with_other_members_is_refused_and_the_old_wheelhouse_kept(node, monkeypatch, name):
    fake, args, prefix = node
    install(args, monkeypatch)
    make_archive(prefix / "wheelhouse.tar", names=WHEELS + [name])
    r = install(args, monkeypatch)
    assert r["failed"] and r["step"] == "unpack" and "only wheel files" in r["msg"]
    assert sorted(os.listdir(prefix / "wheelhouse")) == sorted(WHEELS)
    assert not (prefix.parent / "evil.whl").exists()


def test_missing_archive(node, monkeypatch):
    fake, args, prefix = node
    os.unlink(prefix / "wheelhouse.tar")
    r = install(args, monkeypatch)
    assert r["failed"] and "copy the wheelhouse archive" in r["msg"]
    r = install(args, monkeypatch, check_mode=True)
    assert r["changed"] is True and not r.get("failed")


def test_check_mode_reports_and_runs_nothing(node, monkeypatch):
    fake, args, prefix = node
    r = install(args, monkeypatch, check_mode=True)
    assert r["changed"] is True and fake.calls == []
    assert not (prefix / "wheelhouse").exists()
    install(args, monkeypatch)
    fake.calls.clear()
    assert install(args, monkeypatch, check_mode=True)["changed"] is False
    assert install(dict(args, force=True), monkeypatch, check_mode=True)["changed"] is True
    assert fake.calls == []


def test_wheel_versions_follow_pep_427_names():
    names = [
        "hami_agent-0.1.0-py3-none-any.whl",
        "Hami_Agent-0.2.0-1-py3-none-any.whl",
        "hami_agent_extra-1.0-py3-none-any.whl",
        "hami-agent.tar.gz",
    ]
    assert _wheelhouse.wheel_versions(names, "hami-agent") == ["0.1.0", "0.2.0"]
