"""The committed DRA stubs match our .proto copies, and those match the kubelet's wire format."""

import re

import pytest

from hami_agent.dra.api import dra_v1_pb2, dra_v1beta1_pb2, generate, health_v1_pb2, health_v1alpha1_pb2
from hami_agent.dra.plugin import SUPPORTED_SERVICES

pytestmark = pytest.mark.unit

API_DIR = generate.HERE
STEMS = ("dra_v1", "dra_v1beta1", "health_v1", "health_v1alpha1")


def _serialized_descriptor(pb2_text: str) -> bytes:
    m = re.search(r"AddSerializedFile\((b'.*?')\)\n", pb2_text, re.S)
    assert m, "no serialized descriptor in generated file"
    return eval(m.group(1))  # a bytes literal written by protoc


def _method_paths(text: str) -> set[str]:
    return set(re.findall(r"'(/[\w.]+/\w+)'", text))


@pytest.mark.timeout(60)
def test_committed_stubs_are_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    written = generate.generate(tmp_path)
    assert {p.name for p in written} == {f"{s}{x}" for s in STEMS for x in ("_pb2.py", "_pb2_grpc.py")}
    for stem in STEMS:
        fresh, committed = (tmp_path / f"{stem}_pb2.py").read_text(), (API_DIR / f"{stem}_pb2.py").read_text()
        assert _serialized_descriptor(fresh) == _serialized_descriptor(
            committed
        ), f"{stem}_pb2.py is stale: run .venv/bin/python -m hami_agent.dra.api.generate"
        assert _method_paths((tmp_path / f"{stem}_pb2_grpc.py").read_text()) == _method_paths(
            (API_DIR / f"{stem}_pb2_grpc.py").read_text()
        ), f"{stem}_pb2_grpc.py is stale"


def test_stubs_are_portable():
    for stem in STEMS:
        assert "runtime_version" not in (API_DIR / f"{stem}_pb2.py").read_text()
        grpc_text = (API_DIR / f"{stem}_pb2_grpc.py").read_text()
        assert "GRPC_GENERATED_VERSION" not in grpc_text
        assert re.search(r"^from \. import \w+_pb2 as", grpc_text, re.M)


def test_method_paths_are_the_kubelets():
    # kubernetes staging/src/k8s.io/kubelet/pkg/apis/dra/v1/api_grpc.pb.go (DRAPlugin_*_FullMethodName) and
    # dra-health/v1/api_grpc.pb.go; a wrong package would make every kubelet call Unimplemented
    paths = set()
    for stem in STEMS:
        paths |= _method_paths((API_DIR / f"{stem}_pb2_grpc.py").read_text())
    assert paths == {
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        "/v1.DRAResourceHealth/NodeWatchResources",
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    }
    # the strings registration advertises (kubelet types.go DRAPluginService / DRAResourceHealthService)
    assert SUPPORTED_SERVICES == (
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    )


@pytest.mark.parametrize("pb", [dra_v1_pb2, dra_v1beta1_pb2])
@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        ("NodePrepareResourcesRequest", "claims", 1),
        ("NodePrepareResourcesResponse", "claims", 1),
        ("NodePrepareResourceResponse", "devices", 1),
        ("NodePrepareResourceResponse", "error", 2),
        ("Device", "request_names", 1),
        ("Device", "pool_name", 2),
        ("Device", "device_name", 3),
        ("Device", "cdi_device_ids", 4),
        ("NodeUnprepareResourcesRequest", "claims", 1),
        ("NodeUnprepareResourcesResponse", "claims", 1),
        ("NodeUnprepareResourceResponse", "error", 1),
        ("Claim", "namespace", 1),
        ("Claim", "uid", 2),
        ("Claim", "name", 3),
    ],
)
def test_dra_field_numbers(pb, message, field, number):
    assert getattr(pb, message).DESCRIPTOR.fields_by_name[field].number == number


def test_v1_has_share_id_and_v1beta1_does_not():
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name


@pytest.mark.parametrize("pb", [health_v1_pb2, health_v1alpha1_pb2])
def test_health_fields(pb):
    f = pb.DeviceHealth.DESCRIPTOR.fields_by_name
    assert [
        (n, f[n].number)
        for n in ("device", "health", "last_updated_time", "health_check_timeout_seconds", "message")
    ] == [
        ("device", 1),
        ("health", 2),
        ("last_updated_time", 3),
        ("health_check_timeout_seconds", 4),
        ("message", 5),
    ]
    assert (pb.UNKNOWN, pb.HEALTHY, pb.UNHEALTHY) == (0, 1, 2)


def test_wire_bytes_of_a_known_message():
    # Claim{namespace:"ns", uid:"u", name:"c"} as the kubelet encodes it (proto3: tag, length, bytes)
    assert (
        dra_v1_pb2.Claim(namespace="ns", uid="u", name="c").SerializeToString()
        == b"\n\x02ns\x12\x01u\x1a\x01c"
    )
