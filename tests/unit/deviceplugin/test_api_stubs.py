"""The committed v1beta1 stubs match api.proto and the kubelet's wire format."""

import re
import sys

import pytest

from hami_agent.deviceplugin.api import api_pb2, api_pb2_grpc, generate, pluginregistration_pb2

pytestmark = pytest.mark.unit

API_DIR = generate.HERE


def _serialized_descriptor(pb2_text: str) -> bytes:
    m = re.search(r"AddSerializedFile\((b'.*?')\)\n", pb2_text, re.S)
    assert m, "no serialized descriptor in generated file"
    return eval(m.group(1))  # a bytes literal written by protoc


def _method_paths(grpc_text: str) -> set[str]:
    return set(re.findall(r"'(/[\w.]+/\w+)'", grpc_text))


@pytest.mark.timeout(60)
def test_committed_stubs_are_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    written = generate.generate(tmp_path)
    assert {p.name for p in written} == {
        "api_pb2.py",
        "api_pb2_grpc.py",
        "pluginregistration_pb2.py",
        "pluginregistration_pb2_grpc.py",
    }
    for stem in ("api", "pluginregistration"):
        fresh = (tmp_path / f"{stem}_pb2.py").read_text()
        committed = (API_DIR / f"{stem}_pb2.py").read_text()
        assert _serialized_descriptor(fresh) == _serialized_descriptor(committed), (
            f"{stem}_pb2.py is stale: run .venv/bin/python -m hami_agent.deviceplugin.api.generate"
        )
        fresh_grpc = (tmp_path / f"{stem}_pb2_grpc.py").read_text()
        committed_grpc = (API_DIR / f"{stem}_pb2_grpc.py").read_text()
        assert _method_paths(fresh_grpc) == _method_paths(committed_grpc), f"{stem}_pb2_grpc.py is stale"


def test_stubs_are_portable_across_protobuf_and_grpc_versions():
    for name in ("api_pb2.py", "pluginregistration_pb2.py"):
        text = (API_DIR / name).read_text()
        assert "runtime_version" not in text, f"{name} pins the protobuf runtime; regenerate"
    for name in ("api_pb2_grpc.py", "pluginregistration_pb2_grpc.py"):
        text = (API_DIR / name).read_text()
        assert "GRPC_GENERATED_VERSION" not in text
        assert re.search(r"^from \. import \w+_pb2 as", text, re.M), "stub imports must be package-relative"
    assert "hami_agent.deviceplugin.api.api_pb2" in sys.modules


def _field(message, name):
    return message.DESCRIPTOR.fields_by_name[name]


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        ("DevicePluginOptions", "pre_start_required", 1),
        ("DevicePluginOptions", "get_preferred_allocation_available", 2),
        ("RegisterRequest", "version", 1),
        ("RegisterRequest", "endpoint", 2),
        ("RegisterRequest", "resource_name", 3),
        ("RegisterRequest", "options", 4),
        ("ListAndWatchResponse", "devices", 1),
        ("TopologyInfo", "nodes", 1),
        ("NUMANode", "ID", 1),
        ("Device", "ID", 1),
        ("Device", "health", 2),
        ("Device", "topology", 3),
        ("PreStartContainerRequest", "devices_ids", 1),
        ("PreferredAllocationRequest", "container_requests", 1),
        ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
        ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
        ("ContainerPreferredAllocationRequest", "allocation_size", 3),
        ("PreferredAllocationResponse", "container_responses", 1),
        ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
        ("AllocateRequest", "container_requests", 1),
        ("ContainerAllocateRequest", "devices_ids", 1),
        ("CDIDevice", "name", 1),
        ("AllocateResponse", "container_responses", 1),
        ("ContainerAllocateResponse", "envs", 1),
        ("ContainerAllocateResponse", "mounts", 2),
        ("ContainerAllocateResponse", "devices", 3),
        ("ContainerAllocateResponse", "annotations", 4),
        ("ContainerAllocateResponse", "cdi_devices", 5),
        ("Mount", "container_path", 1),
        ("Mount", "host_path", 2),
        ("Mount", "read_only", 3),
        ("DeviceSpec", "container_path", 1),
        ("DeviceSpec", "host_path", 2),
        ("DeviceSpec", "permissions", 3),
    ],
)
def test_field_numbers_match_the_kubelet_api(message, field, number):
    assert _field(getattr(api_pb2, message), field).number == number


def test_package_and_method_paths():
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    text = (API_DIR / "api_pb2_grpc.py").read_text()
    assert _method_paths(text) == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    assert hasattr(api_pb2_grpc, "DevicePluginServicer")
    assert pluginregistration_pb2.DESCRIPTOR.package == "pluginregistration"
    assert _field(pluginregistration_pb2.PluginInfo, "supported_versions").number == 4


def test_wire_bytes_of_a_known_message():
    # RegisterRequest{version:"v1beta1", endpoint:"nvidia-gpu.sock", resource_name:"nvidia.com/gpu",
    # options{get_preferred_allocation_available:true}} as the kubelet decodes it
    req = api_pb2.RegisterRequest(
        version="v1beta1",
        endpoint="nvidia-gpu.sock",
        resource_name="nvidia.com/gpu",
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    assert req.SerializeToString() == (
        b'\n\x07v1beta1\x12\x0fnvidia-gpu.sock\x1a\x0envidia.com/gpu"\x02\x10\x01'
    )
