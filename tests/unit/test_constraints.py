"""constraints.txt pins every package the dev install needs (scripts/lock-deps.sh writes it).

A dependency added to pyproject.toml without re-locking would install at its newest release on every fresh
machine, CI's included: the reproducibility the file exists for would be gone without anyone noticing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit
tomllib = pytest.importorskip("tomllib", reason="tomllib is 3.11+; make test runs on 3.11")

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for n, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"constraints.txt line {n}: {line!r} is not 'name==version' (re-lock: make lock)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = m.group(2)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    # the lock is made with CI's Python: a requirement its markers exclude there need not be pinned
    env = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.7"}
    return [r for r in reqs if r.marker is None or r.marker.evaluate({**env, "extra": "dev"})]


def test_every_direct_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is not in constraints.txt: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {req}: run make lock")


def test_pip_is_pinned_and_the_makefile_applies_the_file() -> None:
    assert "pip" in _pins(), "constraints.txt must pin pip (the wheelhouses ship it): run make lock"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^export PIP_CONSTRAINT \?= \$\(CURDIR\)/constraints\.txt$", makefile, re.M)
    assert re.search(r"^\$\(STAMP\): .*\bconstraints\.txt\b", makefile, re.M), (
        "the venv must be reinstalled when constraints.txt changes")
