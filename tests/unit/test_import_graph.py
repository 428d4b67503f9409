"""The agent's import graph: no circles anywhere, and the scheduler's sub-packages import only the ones above
them (``hami_agent/scheduler/__init__.py``). Read from the source with ``ast`` (every import counts:
module level, inside functions, under ``TYPE_CHECKING``), so a circle cannot hide behind a lazy import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

AGENT = Path(__file__).resolve().parents[2] / "agent"
STDLIB = set(sys.stdlib_module_names)


def _modules() -> dict[str, Path]:
    out = {}
    for p in (AGENT / "hami_agent").rglob("*.py"):
        parts = p.relative_to(AGENT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every module name ``name`` imports (ours resolved to modules; others by their top-level name)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return out


def _ours(name: str) -> set[str]:
    """Our modules ``name`` depends on, its own ancestor packages left out (Python runs a package's
    ``__init__`` before any of its modules anyway; counting it would make every re-export a circle)."""
    return {d for d in _imports(name) if d in MODULES and d != name and not name.startswith(d + ".")}


def _cycles() -> list[list[str]]:
    graph = {m: _ours(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_in_the_agent() -> None:
    assert _cycles() == []


def test_the_cycle_finder_finds_a_circle(tmp_path) -> None:
    # the check itself can fail: two modules importing each other lazily are found
    graph_before = dict(MODULES)
    try:
        pkg = tmp_path / "hami_agent" / "zz_probe"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "a.py").write_text("def f():\n    from hami_agent.zz_probe import b\n")
        (pkg / "b.py").write_text("from hami_agent.zz_probe.a import f\n")
        for n in ("a", "b"):
            MODULES[f"hami_agent.zz_probe.{n}"] = pkg / f"{n}.py"
        MODULES["hami_agent.zz_probe"] = pkg / "__init__.py"
        assert ["hami_agent.zz_probe.a", "hami_agent.zz_probe.b"] in _cycles()
    finally:
        MODULES.clear()
        MODULES.update(graph_before)


SCHED = "hami_agent.scheduler"
LAYERS = ["core", "state", "verbs", "serve"]  # each may import the ones before it, never those after
CORE_MAY = ("hami_agent.protocol", "hami_agent.config", "hami_agent.log", f"{SCHED}.core")


def test_scheduler_sub_packages_import_only_those_above_them() -> None:
    wrong = []
    for name in sorted(m for m in MODULES if m.startswith(SCHED + ".")):
        layer = name.split(".")[2]
        if layer not in LAYERS:
            continue
        for dep in _ours(name):
            if dep.startswith(SCHED + ".") and dep.split(".")[2] in LAYERS:
                if LAYERS.index(dep.split(".")[2]) > LAYERS.index(layer):
                    wrong.append((name, dep))
    assert wrong == []


def test_the_decision_core_imports_no_kubernetes_http_or_threads() -> None:
    wrong = []
    for name in sorted(m for m in MODULES if m.startswith(f"{SCHED}.core")):
        for dep in _imports(name):
            top = dep.split(".")[0]
            if dep.startswith("hami_agent"):
                if not dep.startswith(CORE_MAY) and dep != "hami_agent":
                    wrong.append((name, dep))
            elif top in ("threading", "socket", "http", "urllib", "asyncio", "concurrent", "subprocess") or (
                    top not in STDLIB and top != "__future__"):
                wrong.append((name, dep))
    assert wrong == []
