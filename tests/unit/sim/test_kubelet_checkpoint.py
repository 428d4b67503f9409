"""The simulated kubelet's checkpoint: the real file shape and the real checksum.

The two golden vectors were computed with the real algorithm: go-spew 1.1.1 (Debian
golang-github-davecgh-go-spew-dev) ``ConfigState{Indent: " ", SortKeys: true, DisableMethods: true,
SpewKeys: true}.Fprintf(fnv.New32a(), "%#v", data)`` over a copy of kubernetes'
``checkpoint.checkpointData`` / ``PodDevicesEntry`` / ``DevicesPerNUMA`` types in a package named
``checkpoint`` (as ``checkpointmanager/checksum.New`` does through ``hash.DeepHashObject``).
"""

from __future__ import annotations

import json

import pytest

from tests.sim.kubelet import checkpoint as cp

pytestmark = pytest.mark.unit

EMPTY = cp.CheckpointData(None, {})
TWO_ENTRIES = cp.CheckpointData(
    [
        cp.PodDevicesEntry(
            "uid-1", "c", "nvidia.com/gpu", {-1: ["GPU-b-0", "GPU-a-1"], 0: ["x"]}, bytes([10, 20, 255])
        ),
        cp.PodDevicesEntry("uid-2", "init", "nvidia.com/gpu", {}, None),
    ],
    {"nvidia.com/gpu": ["b", "a"], "example.com/x": None, "a.b/c": []},
)


def test_spew_rendering_and_checksum_match_go():
    assert cp.spew_text(EMPTY) == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> "
        "RegisteredDevices:(map[string][]string)map[]}"
    )
    assert cp.checksum(EMPTY) == 3467439661
    assert cp.spew_text(TWO_ENTRIES) == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)uid-1 "
        "ContainerName:(string)c ResourceName:(string)nvidia.com/gpu DeviceIDs:(checkpoint.DevicesPerNUMA)"
        "map[-1:[GPU-b-0 GPU-a-1] 0:[x]] AllocResp:([]uint8)[10 20 255]} {PodUID:(string)uid-2 "
        "ContainerName:(string)init ResourceName:(string)nvidia.com/gpu DeviceIDs:(checkpoint.DevicesPerNUMA)"
        "map[] AllocResp:([]uint8)<nil>}] RegisteredDevices:(map[string][]string)map[a.b/c:[] "
        "example.com/x:<nil> nvidia.com/gpu:[b a]]}"
    )
    assert cp.checksum(TWO_ENTRIES) == 2330721954


def test_file_has_the_kubelets_json_shape_and_reads_back(tmp_path):
    cp.write(str(tmp_path), TWO_ENTRIES)
    raw = (tmp_path / cp.CHECKPOINT_FILE).read_bytes()
    doc = json.loads(raw)
    assert list(doc) == ["Data", "Checksum"] and list(doc["Data"]) == [
        "PodDeviceEntries",
        "RegisteredDevices",
    ]
    first = doc["Data"]["PodDeviceEntries"][0]
    assert list(first) == ["PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp"]
    assert first["DeviceIDs"] == {"-1": ["GPU-b-0", "GPU-a-1"], "0": ["x"]} and first["AllocResp"] == "ChT/"
    assert doc["Checksum"] == 2330721954 and b" " not in raw  # compact, like encoding/json
    assert cp.read(str(tmp_path)) == TWO_ENTRIES
    assert json.loads(cp.dumps(EMPTY))["Data"]["PodDeviceEntries"] is None  # Go's nil slice


def test_a_changed_file_is_refused_as_corrupted_and_a_missing_one_as_not_found(tmp_path):
    with pytest.raises(cp.CheckpointError, match="^checkpoint is not found$"):
        cp.read(str(tmp_path))
    cp.write(str(tmp_path), TWO_ENTRIES)
    path = tmp_path / cp.CHECKPOINT_FILE
    path.write_bytes(path.read_bytes().replace(b"GPU-a-1", b"GPU-a-2"))
    with pytest.raises(cp.CheckpointError, match="^checkpoint is corrupted$"):
        cp.read(str(tmp_path))
    path.write_text("{not json")
    with pytest.raises(cp.CheckpointError):
        cp.read(str(tmp_path))


def test_prefix_cached_checksum_equals_the_whole_text_hash_through_appends_and_removals():
    """The checksum continues from the FNV state of a known prefix (the kubelet rewrites the file after
    every allocation); it must equal FNV over the whole text whatever changed: an entry appended, one
    removed from the middle, a response changed in place, the registered devices."""
    import random

    rng = random.Random(7)
    entries: list[cp.PodDevicesEntry] = []
    registered: dict[str, list[str] | None] = {"nvidia.com/gpu": ["a"]}
    for step in range(60):
        action = rng.choice(["append", "append", "remove", "mutate", "register"])
        if action == "append" or not entries:
            resp = rng.randbytes(rng.randrange(40))
            entries.append(cp.PodDevicesEntry(f"uid-{step}", "c", "nvidia.com/gpu",
                                              {-1: [f"GPU-{rng.randrange(8)}"]}, resp))
        elif action == "remove":
            entries.pop(rng.randrange(len(entries)))
        elif action == "mutate":
            entries[rng.randrange(len(entries))].alloc_resp = rng.randbytes(5)
        else:
            registered[f"x.io/r{step % 3}"] = [str(step)]
        data = cp.CheckpointData(list(entries), dict(registered))
        assert cp.checksum(data) == cp.fnv32a(cp.spew_text(data).encode("utf-8")), (step, action)
