"""Extender /filter over real HTTP with a fake API client: wire format (Go field names, case-insensitive
input), annotations written, retries not double-counted, errors and limits, health/metrics/profiling,
TLS."""

from __future__ import annotations

import datetime
import http.client
import json
import ssl

import pytest

from hami_agent.protocol import NodeDevice, decode_pod_devices, encode_node_devices, keys
from hami_agent.scheduler.serve.metrics import SchedulerMetrics
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.unit.scheduler.helpers import FakePodClient, dev, gpu_pod

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def env():
    cache = UsageCache()
    cache.set_node("n1", [dev(0, uuid="GPU-n1-0", mem=8192), dev(1, uuid="GPU-n1-1", mem=8192)])
    cache.set_node("n2", [dev(0, uuid="GPU-n2-0", mem=4096)])
    client = FakePodClient()
    metrics = SchedulerMetrics(cache)
    # /filter answers after its write here (HAMi's order), so a test can read the write's outcome in the
    # answer; write-behind over HTTP: tests/integration/scheduler/test_write_behind.py
    ext = Extender(cache, SchedulerConfig(write_behind=False), client, metrics=metrics)
    ext.synced.set()
    srv = ExtenderHTTPServer(ext, None, registry=metrics.registry, metrics=metrics, profiling_enabled=True,
                             max_body=64 * 1024).start()
    srv.fake_client = client
    yield cache, client, ext, srv
    srv.stop()
    ext.healer.stop()


def post(srv, path, body, raw=None):
    """POST ``body``. The body's pod is first created in the fake API when it is not there yet: the
    extender reads the pod's state from the API, never from the body."""
    client = getattr(srv, "fake_client", None)
    if client is not None and isinstance(body, dict) and isinstance(body.get("Pod") or body.get("pod"), dict):
        pod = body.get("Pod") or body.get("pod")
        key = (pod["metadata"].get("namespace", "default"), pod["metadata"]["name"])
        if key not in client.pods:
            client.add(pod)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def get(srv, path):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
    conn.request("GET", path)
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def test_filter_go_field_names_and_annotations(env):
    cache, client, _ext, srv = env
    code, body = post(srv, "/filter", {"Pod": gpu_pod("p1", mem=6000), "NodeNames": ["n1", "n2"]})
    assert code == 200
    res = json.loads(body)
    assert res == {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None,
                   "FailedAndUnresolvableNodes": None, "Error": ""}
    (ns, name, ann, labels), = client.patches
    assert (ns, name, labels) == ("default", "p1", {keys.VGPU_NODE: "n1"})
    assert ann[keys.DEVICES_ALLOCATED] == ann[keys.DEVICES_TO_ALLOCATE]
    assert decode_pod_devices(ann[keys.DEVICES_ALLOCATED])[0][0].usedmem == 6000
    assert "uid-p1" in cache.pods


def test_lowercase_input_keys_accepted(env):
    _cache, _client, _ext, srv = env
    code, body = post(srv, "/filter", {"pod": gpu_pod("p1", mem=100), "nodenames": ["n2"]})
    assert code == 200 and json.loads(body)["NodeNames"] == ["n2"]


def test_retry_does_not_double_count(env):
    cache, _client, _ext, srv = env
    for _ in range(3):
        code, body = post(srv, "/filter", {"Pod": gpu_pod("p1", mem=8192, cores=100), "NodeNames": ["n1"]})
        assert json.loads(body)["NodeNames"] == ["n1"]
    used = sum(d.used for d in cache.nodes["n1"].devices)
    assert used == 1 and len(cache.pods) == 1


def test_unschedulable_returns_failed_nodes(env):
    _cache, client, _ext, srv = env
    code, body = post(srv, "/filter", {"Pod": gpu_pod("big", mem=9000), "NodeNames": ["n1", "n2", "n3"]})
    res = json.loads(body)
    assert code == 200 and not res["NodeNames"]
    assert res["FailedNodes"] == {"n1": "2/2 CardInsufficientMemory", "n2": "1/1 CardInsufficientMemory",
                                  "n3": "node unregistered"}
    assert client.patches == []


def test_pod_without_gpu_passes_through(env):
    _cache, client, _ext, srv = env
    pod = gpu_pod("cpu")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    res = json.loads(post(srv, "/filter", {"Pod": pod, "NodeNames": ["n1", "x"]})[1])
    assert res["NodeNames"] == ["n1", "x"] and client.patches == []


def _node_obj(name: str, *mems: int) -> dict:
    devs = [NodeDevice(id=f"GPU-{name}-{i}", index=i, count=10, devmem=m, devcore=100, type="NVIDIA-A100",
                       mode="hami-core", health=True) for i, m in enumerate(mems)]
    return {"metadata": {"name": name, "annotations": {keys.NODE_REGISTER: encode_node_devices(devs)}}}


def test_full_nodes_variant_simulates_without_writing(env):
    cache, client, _ext, srv = env
    nodes = {"items": [_node_obj("n1", 8192, 8192), _node_obj("n2", 4096)]}
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p", mem=5000), "Nodes": nodes})[1])
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["n1"]
    assert res["NodeNames"] is None and client.patches == [] and not cache.pods


def test_full_nodes_read_the_given_register_annotations(env):
    # HAMi's filterSimulation builds each node from the given object's hami.io/node-nvidia-register
    # (buildTransientNodeInfo, pkg/scheduler/scheduler.go:693-711, used at 871-904): a node the cache has
    # not seen yet is evaluated, and one without the annotation is "node unregistered". The extender used
    # to look only in its cache, so n3 was "node unregistered".
    cache, client, _ext, srv = env
    nodes = {"items": [_node_obj("n3", 16384), {"metadata": {"name": "n4"}}]}
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("big", mem=12000), "Nodes": nodes})[1])
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["n3"]
    assert "n3" not in cache.nodes and client.patches == []
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("huge", mem=20000), "Nodes": nodes})[1])
    assert res["FailedNodes"] == {"n3": "1/1 CardInsufficientMemory", "n4": "node unregistered"}


def test_bad_requests_name_the_field(env):
    _c, _cl, _e, srv = env
    code, body = post(srv, "/filter", None, raw=b"{not json")
    assert code == 400 and b"malformed JSON" in body
    code, body = post(srv, "/filter", {"NodeNames": ["n1"]})
    assert code == 400 and b"ExtenderArgs.Pod" in body
    code, body = post(srv, "/filter", {"Pod": gpu_pod("p"), "NodeNames": "n1"})
    assert code == 400 and b"ExtenderArgs.NodeNames" in body
    code, body = post(srv, "/filter", {"Pod": gpu_pod("p"), "NodeNames": [["x"]]})
    assert code == 400 and b"ExtenderArgs.NodeNames" in body
    code, body = post(srv, "/bind", {"PodName": "p"})
    assert code == 400 and b"ExtenderBindingArgs.PodNamespace" in body
    code, body = post(srv, "/filter", None, raw=b"x" * (65 * 1024))
    assert code == 413 and b"exceeds the limit" in body
    code, body = post(srv, "/nope", {})
    assert code == 404


def test_invalid_resource_value_is_an_error_result(env):
    _c, _cl, _e, srv = env
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "1.5"
    res = json.loads(post(srv, "/filter", {"Pod": pod, "NodeNames": ["n1"]})[1])
    assert "nvidia.com/gpumem" in res["Error"] and not res["NodeNames"]


def test_refused_annotation_patch_rolls_back_to_the_apis_truth(env):
    cache, client, ext, srv = env
    client.fail_patch = "conflict"  # definitive: the API did not apply it
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]})[1])
    assert res["Error"].startswith("patch pod error") and cache.pods == {}
    assert ext.decisions.get("uid-p1") is None  # /bind will refuse it


def test_annotation_patch_with_lost_answer_is_read_back_not_guessed(env):
    # Regression (issue 16 finding 3): a patch the API applied but answered with an error was treated
    # as "did not happen": the reservation was dropped although the pod carries the allocation.
    cache, client, ext, srv = env
    client.fail_patch = "500-after-apply"
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]})[1])
    assert res["Error"] == "" and res["NodeNames"] == ["n1"]  # read back: it was applied
    assert cache.pods["uid-p1"].devices and ext.decisions.get("uid-p1").node == "n1"


def test_annotation_patch_with_unknown_outcome_keeps_the_reservation(env):
    cache, client, ext, srv = env
    ext.reconciler.settle_s = 0.5
    client.fail_patch = "500"  # the pod is unchanged: the write may still be in flight
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]})[1])
    assert "outcome is not known yet" in res["Error"]
    assert "uid-p1" in cache.pods  # still counted: never under-count
    assert ext.healer.pending("reconcile:")
    # after settle_s without any change of the pod, the write counts as lost: the API's truth is counted
    assert ext.healer.wait_idle(10) and cache.pods == {}


def test_quota_not_fit(env):
    cache, client, ext, srv = env
    client.quotas = [{"spec": {"hard": {"limits.nvidia.com/gpumem": "3000"}}}]
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p1", mem=4000), "NodeNames": ["n1"]})[1])
    assert res["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p2", mem=2000), "NodeNames": ["n1"]})[1])
    assert res["NodeNames"] == ["n1"]
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p3", mem=2000), "NodeNames": ["n1"]})[1])
    assert res["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}  # 2000 used of 3000


def test_health_ready_metrics_profiling(env):
    _c, _cl, _e, srv = env
    assert get(srv, "/healthz") == (200, b"ok")
    assert get(srv, "/readyz")[0] == 200
    post(srv, "/filter", {"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]})
    code, body = get(srv, "/metrics")
    assert code == 200
    text = body.decode()
    assert 'hami_scheduler_requests_total{result="scheduled",verb="filter"} 1.0' in text
    allocated = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("GPUDeviceMemoryAllocated{") and 'nodeid="n1"' in line)
    assert allocated == 100 * 1024 * 1024
    code, body = get(srv, "/debug/pprof/goroutine")
    assert code == 200 and b"thread hami-scheduler-loop" in body
    code, body = get(srv, "/debug/pprof/profile?seconds=0.3")
    assert code == 200 and b"run_forever" in body


def test_readyz_503_until_ready():
    srv = ExtenderHTTPServer(routes={}, ready=lambda: False).start()
    try:
        assert get(srv, "/readyz")[0] == 503
        assert get(srv, "/debug/pprof/goroutine")[0] == 404  # profiling off by default
    finally:
        srv.stop()


def test_tls(tmp_path):
    pytest.importorskip("cryptography")  # comes with ansible-core (dev extra)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    srv = ExtenderHTTPServer(routes={}, cert_file=str(tmp_path / "tls.crt"),
                             key_file=str(tmp_path / "tls.key")).start()
    try:
        assert srv.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        ctx.check_hostname = False
        conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=ctx, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        srv.stop()


def test_failed_retry_clears_stale_assignment(env):
    cache, client, _ext, srv = env
    p1 = gpu_pod("p1", mem=8192, cores=100)
    assert json.loads(post(srv, "/filter", {"Pod": p1, "NodeNames": ["n2"]})[1])["FailedNodes"]
    assert client.patches == []  # never assigned: nothing to clear
    res = json.loads(post(srv, "/filter", {"Pod": gpu_pod("p0", mem=4096), "NodeNames": ["n2"]})[1])
    assert res["NodeNames"] == ["n2"]
    p0 = gpu_pod("p0", mem=4096)
    p0["metadata"]["annotations"] = client.patches[-1][2]
    # another pod takes n2 while p0 is not in the cache (e.g. the scheduler restarted before the
    # informer saw p0's annotations): p0's retry fits nowhere and its old assignment is cleared
    cache.remove_pod("uid-p0")
    post(srv, "/filter", {"Pod": gpu_pod("blocker", mem=4096), "NodeNames": ["n2"]})
    res = json.loads(post(srv, "/filter", {"Pod": p0, "NodeNames": ["n2"]})[1])
    assert res["FailedNodes"] == {"n2": "1/1 CardInsufficientMemory"}
    ns, name, ann, labels = client.patches[-1]
    assert name == "p0" and labels == {keys.VGPU_NODE: None}
    assert ann[keys.VGPU_NODE] is None and ann[keys.DEVICES_ALLOCATED] is None
    assert "uid-p0" not in cache.pods
