"""tools/site_slices.py: site.yml in slices - the partition, the merged account, the exit code, timeouts.

SIMULATED: ``ansible`` and ``ansible-playbook`` are fakes on PATH (this file writes them): ``ansible
--list-hosts`` prints the scenario's hosts; ``ansible-playbook`` writes a fleet_account-format account for the
hosts of its --limit file, to HAMI_NODE_ACCOUNT_FILE, as the scenario says each host ends (a host may also
hang the process or kill it before it writes anything). Each run's argv and extra vars are recorded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("site_slices", REPO / "tools" / "site_slices.py")
slices = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slices)
import site_slices_account as account  # noqa: E402  (on sys.path once site_slices is loaded)

ANSIBLE = """#!{python}
import json, os, sys
fleet = json.load(open(os.environ["FAKE_FLEET"]))
pattern = sys.argv[1]
hosts = fleet["gpu"] if "gpu" in pattern else fleet["sched"]
limit = sys.argv[sys.argv.index("--limit") + 1].split(",") if "--limit" in sys.argv else None
hosts = [h for h in hosts if limit is None or h in limit]
print("  hosts (%d):" % len(hosts))
for h in hosts:
    print("    " + h)
"""

PLAYBOOK = """#!{python}
import json, os, sys, time
fleet = json.load(open(os.environ["FAKE_FLEET"]))
argv = sys.argv[1:]
limit = argv[argv.index("--limit") + 1]
hosts = open(limit[1:]).read().split()
extra = {{}}
for i, a in enumerate(argv):
    if a == "-e" and argv[i + 1].startswith("@"):
        extra.update(json.load(open(argv[i + 1][1:])))
final = not extra.get("site_roll_defer")
with open(os.environ["FAKE_RUNS"], "a") as fh:
    fh.write(json.dumps({{"hosts": hosts, "extra": extra, "argv": argv, "pid": os.getpid()}}) + "\\n")
for h in hosts:
    how = fleet["nodes"].get(h, "converged")
    if how == "hang":
        time.sleep(120)
    if how == "die":
        sys.exit(3)
nodes, rc = {{}}, 0
for h in hosts:
    how = fleet["nodes"].get(h, "converged")
    if how == "disruptive":
        how = "rolled" if final else "pending roll"
    if how == "parked-on-roll":
        how = "parked" if final else "pending roll"
    nodes[h] = {{"state": how, "detail": "fake " + how}}
    if how in ("failed", "unreachable", "parked"):
        rc = max(rc, 4 if how == "unreachable" else 2)
doc = {{"findings": fleet.get("findings", {{}}) if final else {{}}, "playbook": "site.yml",
        "report_dir": fleet.get("report_dir", ""), "settings": {{"serial": "1"}},
        "roll": {{"pass1": {{"order": sorted(nodes)}}}} if final else {{}},
        "nodes": nodes, "needs_attention": [], "summary": {{}}}}
json.dump(doc, open(os.environ["HAMI_NODE_ACCOUNT_FILE"], "w"))
sys.exit(rc)
"""


class Fake:
    def __init__(self, tmp: Path, monkeypatch, gpu, sched=(), nodes=None, **more):
        self.tmp = tmp
        bin_ = tmp / "bin"
        bin_.mkdir()
        for name, text in (("ansible", ANSIBLE), ("ansible-playbook", PLAYBOOK)):
            p = bin_ / name
            p.write_text(text.format(python=sys.executable))
            p.chmod(p.stat().st_mode | stat.S_IXUSR)
        self.fleet = tmp / "fleet.json"
        self.fleet.write_text(
            json.dumps({"gpu": list(gpu), "sched": list(sched), "nodes": nodes or {}, **more})
        )
        self.runs_file = tmp / "runs.jsonl"
        self.inv = tmp / "hosts.yml"
        self.inv.write_text("all: {}\n")
        monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_FLEET", str(self.fleet))
        monkeypatch.setenv("FAKE_RUNS", str(self.runs_file))
        monkeypatch.setenv("HAMI_NODE_ACCOUNT_DIR", str(tmp / "runs"))
        monkeypatch.chdir(tmp)
        self.lines: list[str] = []

    def main(self, *argv: str) -> int:
        return slices.main(
            ["-i", str(self.inv), "--run-dir", str(self.tmp / "run"), *argv], say=self.lines.append
        )

    def runs(self) -> list[dict]:
        return (
            [json.loads(x) for x in self.runs_file.read_text().splitlines()]
            if self.runs_file.exists()
            else []
        )

    def account(self) -> dict:
        return json.loads((self.tmp / "run" / "_account.json").read_text())


def test_partition_is_round_robin_in_inventory_order_and_drops_empty_slices() -> None:
    hosts = [f"n{i}" for i in range(1, 8)]
    assert slices.partition(hosts, 3) == [["n1", "n4", "n7"], ["n2", "n5"], ["n3", "n6"]]
    assert slices.partition(hosts, 1) == [hosts]
    assert slices.partition(["a", "b"], 5) == [["a"], ["b"]]
    assert slices.partition([], 4) == []


def test_the_tool_uses_the_callbacks_account_without_ansible() -> None:
    """One copy of the account (plugins/module_utils/_fleet_account.py) for the callback and the tool; the
    tool loads it by its path, so a controller without Ansible's Python package runs it (a fresh process:
    this one has imported Ansible)."""
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import site_slices_account as a; "
        "print(a.fleet_account.__file__); print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ansible', 'ansible_collections')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(REPO / "tools")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert Path(out[0]) == REPO / "plugins" / "module_utils" / "_fleet_account.py"
    assert out[1] == "[]"


def test_states_and_lines_match_the_callback() -> None:
    from tests.unit.plugins.collection_path import install

    install()
    from ansible_collections.hami.node.plugins.callback import fleet_account as fa
    from ansible_collections.hami.node.plugins.module_utils import _fleet_account as shared

    assert fa.render is shared.render and account.ORDER == shared.ORDER
    doc = {
        "findings": {"X": "y"},
        "summary": {"failed": 1, "pending roll": 1, "changed": 1},
        "needs_attention": ["a"],
        "nodes": {
            "a": {"state": "failed", "play": "plan", "task": "t", "detail": "boom", "slice": 1},
            "b": {"state": "pending roll", "detail": "roll deferred", "slice": 2},
            "c": {"state": "changed", "changed_tasks": 2, "changed": ["x", "y"], "slice": 1},
        },
    }
    ours = [line.replace(" [slice 1]", "").replace(" [slice 2]", "") for line in slices.render(doc)]
    theirs = fa.render(doc)
    assert ours[0] == theirs[0] and ours[2:] == theirs[2:]
    assert ours[1] == theirs[1].replace(
        "pending roll", "PENDING ROLL"
    )  # unrolled after the final run: attention


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--slices", "0"], "must be 1 or more"),
        (["--slices", "2", "--slice-timeout", "0"], "--slice-timeout"),
        (["--slices", "2", "-e", "site_roll_defer=false"], "drop it from your -e"),
        (["--slices", "2", "other.yml"], "--playbook"),
        (["--slices", "2", "--playbook", "nope.yml"], "no such file"),
    ],
)
def test_a_refusal_writes_nothing_and_names_the_fix(tmp_path, monkeypatch, argv, words) -> None:
    f = Fake(tmp_path, monkeypatch, gpu=["n1", "n2"])
    assert f.main(*argv) == 2
    assert words in f.lines[-1] and "refused" in f.lines[-1]
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists() and f.runs() == []


def test_unknown_inventory_and_empty_fleet_are_refused(tmp_path, monkeypatch) -> None:
    f = Fake(tmp_path, monkeypatch, gpu=[])
    assert slices.main(["--slices", "2", "-i", "missing.yml"], say=f.lines.append) == 2
    assert "no such inventory" in f.lines[-1]
    assert f.main("--slices", "2") == 2 and "no GPU node" in f.lines[-1]
    assert not (tmp_path / "run").exists() and f.runs() == []


def test_slices_defer_the_roll_and_one_final_run_rolls_and_runs_the_scheduler(tmp_path, monkeypatch) -> None:
    gpu = [f"n{i}" for i in range(1, 7)]
    f = Fake(
        tmp_path,
        monkeypatch,
        gpu=gpu,
        sched=["cp1"],
        nodes={"n2": "disruptive", "n3": "failed", "n5": "disruptive", "n6": "changed"},
    )
    rc = f.main("--slices", "2", "-v")
    runs = f.runs()
    # the slices start together: their records come in either order
    assert sorted(sorted(r["hosts"]) for r in runs[:2]) == [["n1", "n3", "n5"], ["n2", "n4", "n6"]]
    assert all(
        r["extra"]["site_roll_defer"] is True and r["extra"]["hami_rbac_apply_cluster"] is False
        for r in runs[:2]
    )
    assert runs[0]["extra"]["hami_agent_build_dir"] != runs[1]["extra"]["hami_agent_build_dir"]
    assert "-v" in runs[0]["argv"]
    # one final run: the scheduler hosts and the deferred nodes, and the slices' failures (the roll's bound)
    assert len(runs) == 3 and runs[2]["hosts"] == ["cp1", "n5", "n2"]
    assert runs[2]["extra"] == {"site_slices_failed": ["n3"]}
    doc = f.account()
    states = {h: (v["state"], v["slice"]) for h, v in doc["nodes"].items()}
    assert states == {
        "cp1": ("converged", "final"),
        "n1": ("converged", 1),
        "n2": ("rolled", 2),
        "n3": ("failed", 1),
        "n4": ("converged", 2),
        "n5": ("rolled", 1),
        "n6": ("changed", 2),
    }
    assert doc["needs_attention"] == ["n3"] and rc == 2
    assert doc["summary"] == {"failed": 1, "rolled": 2, "changed": 1, "converged": 3}
    assert [s["slice"] for s in doc["slices"]] == [1, 2, "final"]
    assert (tmp_path / "run" / "_needs-attention.txt").read_text() == "n3\n"
    assert any(line.startswith("n3") and "FAILED" in line and "[slice 1]" in line for line in f.lines)
    assert f.lines[-2].startswith(
        "summary: failed 1, rolled 2, changed 1, converged 3; 1 node(s) need attention"
    )


def test_nothing_deferred_no_scheduler_one_converged_node_carries_the_cluster_writes(
    tmp_path, monkeypatch
) -> None:
    f = Fake(tmp_path, monkeypatch, gpu=["n1", "n2", "n3"], nodes={"n1": "unreachable"})
    rc = f.main("--slices", "3")
    runs = f.runs()
    assert runs[-1]["hosts"] == ["n2"] and "site_roll_defer" not in runs[-1]["extra"]
    doc = f.account()
    assert doc["nodes"]["n2"] == {"state": "converged", "detail": "fake converged", "slice": 2}
    assert rc == 4 and doc["needs_attention"] == ["n1"]


def test_all_converged_exits_0_and_the_account_goes_beside_the_report(tmp_path, monkeypatch) -> None:
    report = tmp_path / "report"
    f = Fake(tmp_path, monkeypatch, gpu=["n1", "n2"], sched=["cp1"], report_dir=str(report))
    assert f.main("--slices", "2") == 0
    doc = json.loads((report / "_account.json").read_text())
    assert doc["needs_attention"] == [] and set(doc["nodes"]) == {"cp1", "n1", "n2"}
    assert (report / "_needs-attention.txt").read_text() == ""


def test_a_finding_about_the_cluster_is_not_0(tmp_path, monkeypatch) -> None:
    f = Fake(tmp_path, monkeypatch, gpu=["n1"], sched=["cp1"], findings={"ALLOCATION_GUARD_MISSING": "no"})
    assert f.main("--slices", "1") == 2
    assert f.account()["findings"] == {"ALLOCATION_GUARD_MISSING": "no"}


def test_a_hung_slice_is_stopped_and_a_dead_one_accounted_the_others_go_on(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slices, "STOP_GRACE_S", 2.0)
    f = Fake(
        tmp_path,
        monkeypatch,
        gpu=["n1", "n2", "n3", "n4", "n5", "n6"],
        nodes={"n1": "hang", "n2": "die", "n6": "disruptive"},
    )
    rc = f.main("--slices", "3", "--slice-timeout", "3")
    doc = f.account()
    nodes = doc["nodes"]
    assert nodes["n1"]["state"] == "failed" and "timeout" in nodes["n1"]["detail"]
    assert nodes["n4"]["state"] == "failed"  # n1's slice-mate: its slice never wrote an account
    assert nodes["n2"]["state"] == "failed" and "exit 3" in nodes["n2"]["detail"]
    assert nodes["n3"]["state"] == "converged" and nodes["n6"]["state"] == "rolled"
    assert {s["slice"]: s["status"] for s in doc["slices"]} == {
        1: "timeout",
        2: "ended",
        3: "ended",
        "final": "ended",
    }
    assert rc == slices.TIMEOUT_RC
    assert f.runs()[-1]["extra"]["site_slices_failed"] == ["n1", "n4", "n2", "n5"]


def test_a_final_run_past_its_timeout_leaves_its_nodes_failed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slices, "STOP_GRACE_S", 2.0)
    f = Fake(
        tmp_path, monkeypatch, gpu=["n1", "n2"], sched=["hang"], nodes={"hang": "hang", "n2": "disruptive"}
    )
    rc = f.main("--slices", "2", "--final-timeout", "2")
    nodes = f.account()["nodes"]
    assert nodes["n2"]["state"] == "failed" and "the final run" in nodes["n2"]["detail"]
    assert nodes["n1"]["state"] == "converged" and rc == slices.TIMEOUT_RC


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_stops_every_slice(tmp_path, monkeypatch) -> None:
    f = Fake(tmp_path, monkeypatch, gpu=["n1", "n2"], nodes={"n1": "hang", "n2": "hang"})
    cmd = [sys.executable, str(REPO / "tools" / "site_slices.py"), "--slices", "2", "-i", str(f.inv),
           "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while len(f.runs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [r["pid"] for r in f.runs()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert not any(_alive(p) for p in pids)


def test_callbacks_keep_the_users_and_add_the_account(tmp_path) -> None:
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ncallbacks_enabled = ansible.posix.profile_tasks\n")
    assert slices.callbacks_enabled({}, tmp_path) == "ansible.posix.profile_tasks,hami.node.fleet_account"
    env = {"ANSIBLE_CALLBACKS_ENABLED": "hami.node.fleet_account"}
    assert slices.callbacks_enabled(env, tmp_path) == "hami.node.fleet_account"


def test_extra_vars_forms(tmp_path) -> None:
    (tmp_path / "v.yml").write_text("site_gpu_nodes: rack1\n")
    got = slices.extra_vars(["a=1 'b=two words'", '{"c": [1]}', "@v.yml"], tmp_path)
    assert got == {"a": "1", "b": "two words", "c": [1], "site_gpu_nodes": "rack1"}
    with pytest.raises(slices.Refusal, match="no such file"):
        slices.extra_vars(["@nope.yml"], tmp_path)
