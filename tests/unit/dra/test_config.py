"""The `dra:` config section: which GPUs of which node the DRA driver manages, and how the device plugin,
the scheduler extender and `hami-agent dra` read it."""

import pytest

from hami_agent import cli
from hami_agent.config import ConfigError, DraPartition, build_config, without_dra_devices
from hami_agent.scheduler.core.dra import without_dra_managed
from hami_agent.scheduler.core.model import DeviceUsage

pytestmark = pytest.mark.unit

DOC = {
    "dra": {
        "driverName": "gpu.example.com",
        "devices": "none",
        "nodes": [
            {"name": "both-1", "devices": {"index": [2, 3], "uuid": ["GPU-x"]}},
            {"name": "dra-1", "devices": "all"},
        ],
    }
}


def test_partitions_per_node_with_a_default():
    cfg = build_config([DOC], "both-1")
    assert cfg.dra.driver_name == "gpu.example.com"
    assert cfg.dra.partition_for("both-1") == DraPartition(uuids=("GPU-x",), indexes=(2, 3))
    assert cfg.dra.partition_for("dra-1").all and cfg.dra.partition_for("other").empty
    assert build_config([], "n").dra.partition_for("n").empty  # no section: nothing is DRA's
    part = cfg.dra.partition_for("both-1")
    assert part.manages("GPU-y", 2) and part.manages("GPU-x", 0) and not part.manages("GPU-y", 0)
    assert part.describe() == "index [2, 3] and uuid ['GPU-x']"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"dra": {"devices": "some"}}, "dra.devices: invalid value 'some': use 'all', 'none', or {uuid"),
        ({"dra": {"devices": {"index": ["a"]}}}, "dra.devices.index[0]: invalid value 'a'"),
        ({"dra": {"devices": {"gpu": [1]}}}, "unknown keys ['gpu']"),
        ({"dra": {"driverName": "GPU_HAMI"}}, "dra.driverName: invalid value 'GPU_HAMI'"),
        ({"dra": {"nodes": [{"devices": "all"}]}}, "dra.nodes[0].name"),
        ({"dra": {"nodes": [{"name": "a"}, {"name": "a"}]}}, "each node may appear once"),
        ({"dra": ["all"]}, "dra: invalid value"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(doc, message):
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    ):
        build_config([doc], "n")


def test_the_device_plugin_leaves_dra_gpus_out_and_refuses_when_none_are_left():
    cfg = build_config(
        [{**DOC, "nodeconfig": [{"name": "both-1", "filterdevices": {"index": [7]}}]}], "both-1"
    )
    filt = without_dra_devices(cfg).node.filter_devices
    assert filt.indexes == (7, 2, 3) and filt.uuids == ("GPU-x",)
    assert without_dra_devices(build_config([DOC], "other")) == build_config([DOC], "other")
    with pytest.raises(ConfigError, match="every GPU of node dra-1 is assigned to the DRA driver"):
        without_dra_devices(build_config([DOC], "dra-1"))


def _dev(i, uuid):
    return DeviceUsage(id=uuid, index=i, type="NVIDIA A100", count=10, totalmem=81920, totalcore=100)


def test_the_extender_ignores_registered_gpus_assigned_to_dra():
    devs = [_dev(0, "GPU-a"), _dev(2, "GPU-b"), _dev(5, "GPU-x")]
    dra = build_config([DOC], None).dra
    assert [d.id for d in without_dra_managed("both-1", devs, dra)] == ["GPU-a"]
    assert without_dra_managed("dra-1", devs, dra) == []
    assert [d.id for d in without_dra_managed("other", devs, dra)] == ["GPU-a", "GPU-b", "GPU-x"]
    assert without_dra_managed("both-1", None, dra) is None
    assert [d.id for d in without_dra_managed("both-1", devs, None)] == ["GPU-a", "GPU-b", "GPU-x"]


def test_hami_agent_dra_refuses_a_node_without_dra_gpus(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dra: {devices: none}\n")
    assert cli.main(["dra", "--node-name", "n1", "--config", str(cfg)]) == 2
    assert "no GPU of node n1 is assigned to the DRA driver" in capsys.readouterr().err
    cfg.write_text("dra: {devices: all}\n")
    assert cli.main(["dra", "--node-name", "n1", "--config", str(cfg), "--rpc-deadline", "50"]) == 2
    assert "shorter than the kubelet's 45 s" in capsys.readouterr().err


def test_the_extenders_node_sync_drops_dra_gpus_from_the_register_annotation():
    """The wiring, not only the filter: ClusterSync.on_node reads the annotation through it."""
    from hami_agent.protocol import NodeDevice, encode_node_devices, keys
    from hami_agent.scheduler.state.cache import UsageCache
    from hami_agent.scheduler.state.sync import ClusterSync

    devs = [NodeDevice(id=f"GPU-{i}", index=i, count=10, devmem=81920, devcore=100, type="NVIDIA-A100",
                       numa=0, mode="hami-core", health=True) for i in range(4)]
    node = {"metadata": {"name": "both-1", "annotations": {keys.NODE_REGISTER: encode_node_devices(devs)}}}
    cache = UsageCache()
    ClusterSync(None, cache, dra=build_config([DOC], None).dra).on_node(node)
    assert [d.id for d in cache.nodes["both-1"].devices] == ["GPU-0", "GPU-1"]
    plain = UsageCache()
    ClusterSync(None, plain).on_node(node)  # without the section every registered GPU counts (the old code)
    assert len(plain.nodes["both-1"].devices) == 4
