"""module_utils._mig: mig-parted v1 parsing, per-GPU resolution, profile validation and the plan."""

from __future__ import annotations

import pytest
from ansible_collections.hami.node.plugins.module_utils import _mig

pytestmark = pytest.mark.unit


def gpu(index, enabled=False, pending=None, capable=True, name="NVIDIA H20", dev="0x233010DE"):
    return {
        "index": index,
        "name": name,
        "memory_total_mib": 97871,
        "mig_capable": capable,
        "mig_enabled": enabled,
        "mig_pending": enabled if pending is None else pending,
        "pci_device_id": dev,
    }


SEED_LAYOUT = {"3g.48gb": 1, "1g.24gb": 1, "1g.12gb": 2}

CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "seed-003": [
            {"devices": [0, 1, 2], "mig-enabled": True, "mig-devices": SEED_LAYOUT},
            {"devices": [3], "mig-enabled": False},
        ],
    },
}


def test_parse_mig_parted_selects_config():
    specs = _mig.parse_mig_parted(CONFIG, "seed-003")
    assert specs[0]["devices"] == [0, 1, 2] and specs[0]["mig_devices"] == SEED_LAYOUT
    assert specs[1] == {"devices": [3], "enabled": False, "mig_devices": {}, "device_filter": None}


@pytest.mark.parametrize(
    ("config", "name", "message"),
    [
        ({"version": "v2", "mig-configs": {}}, "x", "unknown version 'v2'"),
        (CONFIG, "nope", "available: all-disabled, seed-003"),
        (
            {"version": "v1", "mig-configs": {"c": [{"devices": "all", "mig-enabled": True}]}},
            "c",
            "mig-devices is required",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {
                    "c": [{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.12gb": 1}}]
                },
            },
            "c",
            "must be empty",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {
                    "c": [{"devices": "all", "mig-enabled": True, "mig-devices": {}, "extra": 1}]
                },
            },
            "c",
            "unknown keys \\['extra'\\]",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"c": [{"devices": "some", "mig-enabled": True, "mig-devices": {}}]},
            },
            "c",
            "devices must be 'all'",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"c": [{"devices": "all", "mig-enabled": True, "mig-devices": {"big": 1}}]},
            },
            "c",
            "not a MIG profile name",
        ),
    ],
)
def test_parse_mig_parted_rejects(config, name, message):
    with pytest.raises(_mig.MigConfigError, match=message):
        _mig.parse_mig_parted(config, name)


def test_gpu_list_form_counts_profiles():
    specs = _mig.parse_gpu_list(
        [
            {"index": 0, "profiles": ["3g.48gb", "1g.24gb", "1g.12gb", "1g.12gb"]},
            {"index": 3, "mig_enabled": False, "profiles": []},
        ]
    )
    assert specs[0]["mig_devices"] == SEED_LAYOUT and specs[0]["enabled"] is True
    assert specs[1]["enabled"] is False
    with pytest.raises(_mig.MigConfigError, match="listed twice"):
        _mig.parse_gpu_list([{"index": 0}, {"index": 0}])


def test_desired_all_skips_non_mig_gpus_and_filters():
    gpus = [gpu(0), gpu(1, capable=False, name="Tesla T4", dev="0x1EB810DE")]
    specs = [{"devices": "all", "enabled": True, "mig_devices": {"1g.12gb": 7}, "device_filter": None}]
    assert list(_mig.desired_per_gpu(specs, gpus)) == [0]
    specs = [{"devices": [1], "enabled": True, "mig_devices": {}, "device_filter": None}]
    with pytest.raises(_mig.MigConfigError, match="does not support MIG"):
        _mig.desired_per_gpu(specs, gpus)
    specs = [{"devices": "all", "enabled": True, "mig_devices": {}, "device_filter": ["0x20b010de"]}]
    assert _mig.desired_per_gpu(specs, gpus) == {}
    with pytest.raises(_mig.MigConfigError, match="does not exist"):
        _mig.desired_per_gpu(
            [{"devices": [9], "enabled": False, "mig_devices": {}, "device_filter": None}], gpus
        )


def test_validate_profiles_lists_valid_ones():
    gpus = [gpu(0)]
    with pytest.raises(_mig.MigConfigError) as err:
        _mig.validate_profiles({0: {"enabled": True, "mig_devices": {"3g.40gb": 1}}}, gpus, {})
    assert "valid profiles: 1g.12gb, 1g.12gb+me, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb, 7g.96gb" in str(
        err.value
    )
    with pytest.raises(_mig.MigConfigError, match="at most 2 fit"):
        _mig.validate_profiles({0: {"enabled": True, "mig_devices": {"3g.48gb": 3}}}, gpus, {})
    # -lgip data (MIG already on) wins over the built-in table.
    _mig.validate_profiles({0: {"enabled": True, "mig_devices": {"odd.1": 1}}}, gpus, {0: {"odd.1": 1}})


def test_builtin_catalog_models():
    assert "1g.5gb" in _mig.builtin_catalog("NVIDIA A100-SXM4-40GB", 40960)
    assert "1g.10gb" in _mig.builtin_catalog("NVIDIA A100-SXM4-80GB", 81920)
    assert "7g.141gb" in _mig.builtin_catalog("NVIDIA H200", 143771)
    assert "3g.48gb" in _mig.builtin_catalog("NVIDIA H20", 97871)
    assert _mig.builtin_catalog("Tesla T4", 15360) is None


def current(enabled, pending=None, devices=None, orphans=()):
    return {
        "enabled": enabled,
        "pending": enabled if pending is None else pending,
        "capable": True,
        "mig_devices": dict(devices or {}),
        "orphan_gis": list(orphans),
    }


def test_plan_is_empty_when_applied():
    want = {0: {"enabled": True, "mig_devices": SEED_LAYOUT}, 3: {"enabled": False, "mig_devices": {}}}
    cur = {0: current(True, devices=SEED_LAYOUT), 3: current(False)}
    assert _mig.plan(want, cur) == []


def test_plan_steps():
    want = {0: {"enabled": True, "mig_devices": SEED_LAYOUT}}
    assert _mig.plan(want, {0: current(False)}) == [{"gpu": 0, "steps": ["set_mode", "reset", "create"]}]
    # Already pending enable (set by someone else): only the reset and the layout remain.
    assert _mig.plan(want, {0: current(False, pending=True)}) == [{"gpu": 0, "steps": ["reset", "create"]}]
    assert _mig.plan(want, {0: current(True, devices={"7g.96gb": 1})}) == [
        {"gpu": 0, "steps": ["clear", "create"]}
    ]
    # A GPU instance without compute instance is not a usable device: rebuild.
    assert _mig.plan(want, {0: current(True, devices=SEED_LAYOUT, orphans=[3])}) == [
        {"gpu": 0, "steps": ["clear", "create"]}
    ]
    off = {0: {"enabled": False, "mig_devices": {}}}
    assert _mig.plan(off, {0: current(True, devices=SEED_LAYOUT)}) == [
        {"gpu": 0, "steps": ["clear", "set_mode", "reset"]}
    ]


def test_creation_order_largest_first():
    assert _mig.creation_order({"1g.12gb": 2, "3g.48gb": 1, "1g.24gb": 1}) == [
        "3g.48gb",
        "1g.24gb",
        "1g.12gb",
        "1g.12gb",
    ]


def test_current_per_gpu_counts_and_orphans():
    lgi = [{"gpu": 0, "profile": "3g.48gb", "gi_id": 1}, {"gpu": 0, "profile": "1g.12gb", "gi_id": 5}]
    lci = [{"gpu": 0, "gi_id": 1}]
    cur = _mig.current_per_gpu([gpu(0, enabled=True)], lgi, lci)
    assert cur[0]["mig_devices"] == {"3g.48gb": 1, "1g.12gb": 1}
    assert cur[0]["orphan_gis"] == [5]
