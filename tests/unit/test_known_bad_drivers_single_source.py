"""The known-bad NVIDIA driver list exists once: plugins/module_utils/known_bad_drivers.py.

The agent imports that very file (``hami_agent.known_bad_drivers`` is a symlink the wheel build copies
in), the roles read it through the ``hami.node.known_bad_driver`` filter, and this test fails when a file
spells out the list anywhere else -- three or more of its versions, or two next to each other (a list or
a range such as "<first>-<last>") -- since such a copy silently goes stale when the list changes.
A single version used as a test fixture is fine.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hami_agent import known_bad_drivers as agent_copy
from hami_agent.doctor import knownbad
from tests.unit.plugins.collection_path import install

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "plugins" / "module_utils" / "known_bad_drivers.py"
CODE_SUFFIXES = {
    ".py",
    ".yml",
    ".yaml",
    ".j2",
    ".c",
    ".h",
    ".json",
    ".sh",
    ".toml",
    ".cfg",
    ".ini",
    ".txt",
    "",
}
# Allowed to name several listed versions, and why:
ALLOWED = {
    "plugins/module_utils/known_bad_drivers.py": "the list",
    # gpusim is the simulated *driver*: which builds hang is a fact of the simulated world, kept apart on
    # purpose so that a wrong product list is caught by the tests instead of being mirrored by them
    "tests/gpusim/src/nvml.c": "simulated driver",
    "tests/gpusim/gpusim_state.py": "simulated driver (Python mirror of nvml.c)",
    "tests/gpusim/bin/nvidia-smi": "simulated driver (its nvidia-smi)",
}
NEAR = 20  # characters: two versions this close form a list or a range


def _tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [ROOT / p for p in out.decode().split("\0") if p]


def _near(text: str, a: str, b: str) -> bool:
    pos_a = [i for i in range(len(text)) if text.startswith(a, i)]
    pos_b = [i for i in range(len(text)) if text.startswith(b, i)]
    return any(abs(i - j) <= NEAR + len(a) for i in pos_a for j in pos_b)


def test_the_agent_reads_the_collections_file():
    assert Path(agent_copy.__file__).resolve() == SOURCE.resolve()
    assert sorted(knownbad.KNOWN_BAD_DRIVERS) == agent_copy.sorted_versions()
    for version, entry in agent_copy.KNOWN_BAD_DRIVERS.items():
        typed = knownbad.lookup(version)
        assert (typed.reason, typed.reference, typed.condition, typed.fixed_in) == (
            entry["reason"],
            entry["reference"],
            entry["condition"],
            entry["fixed_in"],
        )


def test_no_other_file_spells_out_the_list():
    versions = agent_copy.sorted_versions()
    offenders = []
    for path in _tracked_files():
        rel = path.relative_to(ROOT).as_posix()
        if path.is_symlink() or not path.is_file() or path.suffix not in CODE_SUFFIXES or rel in ALLOWED:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        named = [v for v in versions if v in text]
        if len(named) >= 3 or (len(named) == 2 and _near(text, *named)):
            offenders.append(f"{rel}: {', '.join(named)}")
    assert not offenders, (
        "another copy of the known-bad driver list; read plugins/module_utils/"
        "known_bad_drivers.py instead:\n" + "\n".join(offenders)
    )


def test_the_roles_filter_reads_the_same_list():
    install()
    from ansible.errors import AnsibleFilterError
    from ansible_collections.hami.node.plugins.filter.known_bad_driver import FilterModule

    lookup = FilterModule().filters()["known_bad_driver"]
    for version in agent_copy.sorted_versions():
        assert lookup(version) == agent_copy.lookup(version)
    assert lookup("570.172.08") is None and lookup("") is None
    extra = [{"version": "999.1.2", "reason": "site says no"}]
    assert lookup("999.1.2", extra=extra)["reason"] == "site says no"
    with pytest.raises(AnsibleFilterError, match="needs a 'version'"):
        lookup("1.2.3", extra=[{"reason": "x"}])


@pytest.mark.integration
def test_the_agent_wheel_carries_the_file_not_a_link(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with zipfile.ZipFile(glob.glob(str(tmp_path / "*.whl"))[0]) as whl:
        assert whl.read("hami_agent/known_bad_drivers.py") == SOURCE.read_bytes()
