"""``hami-agent doctor invariants --from-file``: the dump formats kubectl writes, the table and JSON
output, exit codes, hostile input (never a traceback), and one runbook per finding kind."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

from hami_agent.cli import main as agent_main
from hami_agent.doctor import invariant_docs
from hami_agent.doctor.invariants_cmd import DumpError, split_dump
from hami_agent.doctor.runbooks import invariant_pages
from tests.unit.scheduler.test_invariants import node, pod

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
OVER = [pod("a", "GPU-n1-0,NVIDIA,6000,60:;"), pod("b", "GPU-n1-0,NVIDIA,6000,60:;")]


def with_kinds(nodes: list[dict], pods: list[dict]) -> list[dict]:
    return [{"kind": "Node", "apiVersion": "v1", **n} for n in nodes] + \
        [{"kind": "Pod", "apiVersion": "v1", **p} for p in pods]


def doctor(capsys, *argv: str) -> tuple[int, str, str]:
    root = logging.getLogger("hami_agent")
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        rc = agent_main(["doctor", "invariants", *argv])
    finally:
        root.handlers[:], root.level, root.propagate = saved
    out = capsys.readouterr()
    return rc, out.out, out.err


def dump(tmp_path: Path, doc, name: str = "dump.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_kubectl_list_dump_with_violations_exits_1_and_lists_them(capsys, tmp_path):
    path = dump(tmp_path, {"apiVersion": "v1", "kind": "List", "items": with_kinds([node()], OVER)})
    rc, out, _ = doctor(capsys, "--from-file", path, "--json")
    assert rc == 1
    rep = json.loads(out)
    assert rep["ok"] is False and rep["by_kind"] == {"overcommit-memory": 1, "overcommit-cores": 1}
    assert rep["counts"] == {"pods": 2, "bound": 2, "reservations": 0, "gpus": 1}
    v = next(v for v in rep["violations"] if v["kind"] == "overcommit-memory")
    assert v["subject"] == "n1/GPU-n1-0" and "12000 MiB promised of 8000 MiB" in v["detail"]
    assert v["runbook"] == "docs/runbooks/invariants/overcommit-memory.md"
    assert (ROOT / v["runbook"]).is_file()
    rc, out, _ = doctor(capsys, "--from-file", path)  # the table
    assert rc == 1
    assert re.search(r"^overcommit-memory\s+n1/GPU-n1-0\s+12000 MiB promised", out, re.M), out
    assert "overcommit-cores: docs/runbooks/invariants/overcommit-cores.md" in out


def test_consistent_dump_exits_0(capsys, tmp_path):
    items = with_kinds([node()], [pod("a", "GPU-n1-0,NVIDIA,4000,50:;")])
    path = dump(tmp_path, {"kind": "List", "items": items})
    rc, out, _ = doctor(capsys, "--from-file", path)
    assert rc == 0 and "all invariants hold" in out


def test_node_and_pod_lists_without_item_kinds_and_stdin(capsys, monkeypatch):
    """`kubectl get nodes -o json` and `kubectl get pods -A -o json` concatenated into a JSON list, read
    from stdin: the items carry no kind, the list's kind says it."""
    doc = [{"kind": "NodeList", "items": [node()]}, {"kind": "PodList", "items": OVER}]
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc)))
    rc, out, _ = doctor(capsys, "--from-file", "-", "--json")
    assert rc == 1 and json.loads(out)["counts"]["pods"] == 2


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not JSON"),
    ('"a string"', "dump: want a Kubernetes object or list, got str"),
    ('{"kind": "List", "items": [{"kind": "Service"}]}', "no Node or Pod objects in it"),
    ('{"kind": "List", "items": [3]}', "dump.items[0]: want a Kubernetes object or list, got int"),
])
def test_a_file_that_is_not_a_dump_is_a_usage_error_naming_it(capsys, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    rc, out, err = doctor(capsys, "--from-file", str(path))
    assert rc == 2 and out == "" and message in err and "Traceback" not in err
    rc, _, err = doctor(capsys, "--from-file", str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read" in err


def test_hostile_field_types_do_not_crash_the_checker(capsys, tmp_path):
    """A dump can hold anything: annotations of the wrong type count as absent or undecodable."""
    weird = pod("w", "GPU-n1-0,NVIDIA,100,1:;")
    weird["metadata"]["annotations"]["hami.io/vgpu-node"] = ["n1"]
    bad_alloc = pod("x", "GPU-n1-0,NVIDIA,100,1:;")
    bad_alloc["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = {"a": 1}
    garbled = pod("y", "not a device string")
    odd = pod("z", "GPU-n1-0,NVIDIA,100,1:;")
    odd["spec"]["initContainers"] = "x"
    odd["metadata"]["uid"] = ["u"]
    n = node(lock=123)
    n["metadata"]["annotations"]["hami.io/node-nvidia-register"] = 5
    items = with_kinds([n, {"metadata": "x"}], [weird, bad_alloc, garbled, odd, {"spec": None}])
    rc, out, err = doctor(capsys, "--from-file", dump(tmp_path, {"kind": "List", "items": items}), "--json")
    assert "Traceback" not in err
    rep = json.loads(out)
    assert rc == 1 and rep["by_kind"].get("undecodable-allocation") == 1  # the garbled device string


def test_split_dump_ignores_other_kinds():
    items = [{"kind": "Node"}, {"kind": "Event"}, {"kind": "Pod"}]
    nodes, pods = split_dump({"kind": "List", "items": items})
    assert len(nodes) == 1 and len(pods) == 1
    with pytest.raises(DumpError):
        split_dump(7)


def test_every_finding_kind_has_an_up_to_date_runbook():
    source = (ROOT / "agent" / "hami_agent" / "doctor" / "invariants.py").read_text()
    reported = set(re.findall(r'rep\.add\("([a-z-]+)"', source))
    assert reported and reported == set(invariant_docs.KIND_DOCS), reported ^ set(invariant_docs.KIND_DOCS)
    for name, text in invariant_pages().items():
        path = ROOT / "docs" / "runbooks" / name
        assert path.is_file() and path.read_text(encoding="utf-8") == text, \
            f"regenerate with: python -m hami_agent.doctor.runbooks --write docs/runbooks ({name})"
        for section in ("## What it means", "## Usual causes", "## Fix"):
            assert section in text


def test_kubectl_plugin_has_the_command(capsys, tmp_path):
    from hami_agent.doctor.kubectl import main as kubectl_main

    path = dump(tmp_path, {"kind": "List", "items": with_kinds([node()], OVER)})
    root = logging.getLogger("hami_agent")
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        rc = kubectl_main(["doctor", "invariants", "--from-file", path])
    finally:
        root.handlers[:], root.level, root.propagate = saved
    assert rc == 1 and "overcommit-memory" in capsys.readouterr().out


def test_nodes_given_as_a_generator_are_checked_for_locks_too():
    """Found while writing the command: ``check`` walked ``nodes`` twice, so an iterator's second pass
    (the lock check) saw nothing and a stale lock went unreported."""
    from hami_agent.doctor.invariants import check

    stale = node(lock="2020-01-01T00:00:00Z,default,gone")
    assert check(iter([stale]), iter([])).by_kind() == {"stale-lock": 1}
    assert check([stale], []).by_kind() == {"stale-lock": 1}
