"""The doctor's known-bad driver list must equal the Ansible collection's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hami_agent.doctor import knownbad

pytestmark = pytest.mark.unit

MODULE_UTILS = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "known_bad_drivers.py"


def _collection_list():
    if not MODULE_UTILS.is_file():
        pytest.skip(f"{MODULE_UTILS} not present yet")
    spec = importlib.util.spec_from_file_location("_hami_known_bad_drivers", MODULE_UTILS)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_both_lists_agree() -> None:
    mod = _collection_list()
    theirs = mod.KNOWN_BAD_DRIVERS
    ours = knownbad.KNOWN_BAD_DRIVERS
    assert sorted(theirs) == sorted(ours)
    for version, entry in theirs.items():
        assert ours[version].condition == entry["condition"], version
        assert ours[version].fixed_in == entry["fixed_in"], version
        assert ours[version].reference == entry["reference"], version


def test_trigger_condition_agrees() -> None:
    mod = _collection_list()
    for modes in ([True, False], [True, True], [False, False], []):
        assert knownbad.triggered(knownbad.lookup("570.158.01"), modes) == \
            mod.triggered(mod.lookup("570.158.01"), modes), modes


def test_lookup() -> None:
    assert knownbad.lookup("570.172.08") is None
    assert knownbad.lookup(" 570.158.01\n").version == "570.158.01"
    assert knownbad.lookup(None) is None
