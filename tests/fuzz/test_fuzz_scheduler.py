"""Fuzz the scheduler's HTTP inputs (issue 14 deliverable 7): /filter, /prioritize, /bind and /webhook
with valid requests mutated anywhere (a field replaced by arbitrary JSON, or removed), hostile
annotation and quantity strings, and arbitrary bytes. Against the real SchedulerApp (informers, usage
cache, extender, webhook) on the SIMULATED API server. Every answer must be < 500 and arrive (no dropped
connection); afterwards the server is alive and its /filter median latency is what it was before.

The extender takes a pod's identity from the body and its state from the API (docs/scheduler.md, "What
the extender trusts"), so the valid templates name pods that exist in the API with the uids the API
gave them, and hostile annotations and quantities are written into the API's pod, not only the body."""

from __future__ import annotations

import copy
import http.client
import itertools
import json
import statistics
import time

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from hami_agent.k8s.client import KubeClient
from hami_agent.protocol.names import label_error, subdomain_error, uid_error
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.fuzz.strategies import bad_name, json_value, mutated, non_utf8, quantity_text
from tests.integration.scheduler.cluster import gpu_node, gpu_pod
from tests.sim.apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The templates' uids are placeholders until the fixture has created the pods: the API assigns them (the
# strategies copy a template when they draw, so they see the real uid).
POD = gpu_pod("fuzz", mem=1000, cores=10)
POD["metadata"]["uid"] = "uid-fuzz"
POD["metadata"]["annotations"] = {"nvidia.com/use-gputype": "T4", "hami.io/gpu-scheduler-policy": "binpack"}
FILTER = {"Pod": POD, "NodeNames": ["gpu-0", "gpu-1", "nope"]}
BIND_POD = gpu_pod("fuzz-bind", mem=1000, cores=10)  # its own pod: a bind that succeeds binds it for good
BIND = {"PodName": "fuzz-bind", "PodNamespace": "default", "PodUID": "uid-fuzz-bind", "Node": "gpu-0"}
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                      "operation": "CREATE", "namespace": "default", "userInfo": {"username": "alice"},
                      "object": POD}}
# the allocation guard (/validate, scheduler/serve/guard.py): an UPDATE of a scheduled pod by its owner
SCHEDULED = json.loads(json.dumps(POD))
SCHEDULED["spec"]["nodeName"] = "gpu-0"
SCHEDULED["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-a,NVIDIA,1000,10:;"
VALIDATE = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "v-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "UPDATE",
                        "namespace": "default", "name": "fuzz", "userInfo": {"username": "alice"},
                        "object": SCHEDULED, "oldObject": SCHEDULED}}
ANNOTATION_KEYS = ["nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid",
                   "nvidia.com/nouse-gpuuuid", "hami.io/node-scheduler-policy",
                   "hami.io/gpu-scheduler-policy",
                   "hami.io/device-scoring-weights", "nvidia.com/numa-bind", "nvidia.com/vgpu-mode",
                   "hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-node",
                   "hami.io/bind-phase"]
RESOURCE_KEYS = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                 "nvidia.com/priority", "nvidia.com/mig-1g.10gb"]


class Caller:
    """One keep-alive connection, like kube-scheduler's; reopened only after the server closed it
    deliberately (an answer with Connection: close)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None
        self.statuses: list[int] = []

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            r = self.conn.getresponse()
            data = r.read()
        except (ConnectionError, http.client.HTTPException) as exc:  # a dropped connection fails the test
            self.conn.close()
            self.conn = None
            raise AssertionError(f"{path}: no answer ({exc!r}) for body {body[:300]!r}") from exc
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        self.statuses.append(r.status)
        return r.status, data

    def check(self, path: str, body: bytes) -> int:
        code, data = self.post(path, body)
        assert code < 500, f"{path} answered {code} {data[:300]!r} for {body[:300]!r}"
        if code >= 400:
            assert json.loads(data)["error"], data  # a 4xx always says why
        return code


def informer_caught_up(app: SchedulerApp, api: ApiServer, timeout: float = 10.0) -> None:
    """Wait until the extender's pending-pod informer shows the valid pod as the API stores it. Each
    /filter writes the pod's assignment conditional on the resourceVersion its informer copy has, so a
    re-filter that outruns the watch meets a 409 and is refused (correctly). kube-scheduler re-filters a
    pod only after a failed binding cycle and its backoff (>= 1 s), long after the watch delivered."""
    md = POD["metadata"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        cached = app.sync.pending_pod("default", md["name"])
        stored = api.get("Pod", "default", md["name"])
        if cached and cached["metadata"].get("resourceVersion") == stored["metadata"].get("resourceVersion"):
            return
        time.sleep(0.01)
    raise AssertionError(f"the extender's informer never showed pod {md['name']} as stored in {timeout} s")


def filter_median_ms(caller: Caller, app: SchedulerApp, api: ApiServer, n: int = 30) -> float:
    """Median latency of a /filter that decides (and writes) for the valid pod: the full path."""
    body = json.dumps(FILTER).encode()
    times = []
    for _ in range(n):
        informer_caught_up(app, api)  # untimed: what kube-scheduler's backoff gives the watch
        t0 = time.perf_counter()
        code, data = caller.post("/filter", body)
        times.append(time.perf_counter() - t0)
        assert code == 200, data
        result = json.loads(data)
        assert result["Error"] == "" and result["NodeNames"], result
    return statistics.median(times) * 1e3


def create_pod(api: ApiServer, pod: dict) -> dict:
    """Create like a client would (no uid: the API assigns it) and return the stored pod."""
    md = {k: v for k, v in pod["metadata"].items() if k != "uid"}
    return api.create({**copy.deepcopy(pod), "metadata": copy.deepcopy(md)})


@pytest.fixture(scope="module")
def stack():
    api = ApiServer().start()
    for i in range(2):
        api.create(gpu_node(f"gpu-{i}", gpus=2, mem=16384))
    POD["metadata"]["uid"] = create_pod(api, POD)["metadata"]["uid"]
    BIND["PodUID"] = create_pod(api, BIND_POD)["metadata"]["uid"]
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    # /filter answers after its write, so one pod can be filtered again and again (kube-scheduler never
    # re-filters a pod whose assignment is being written behind; that refusal: test_write_behind.py)
    app = SchedulerApp(client, SchedulerConfig(write_behind=False), register_interval_s=60).start()
    try:
        assert app.extender.synced.wait(10)
        caller = Caller(app.server.port)
        # the bind template binds what this extender decided: its /filter decision for fuzz-bind
        bind_pod = {**BIND_POD, "metadata": {**BIND_POD["metadata"], "uid": BIND["PodUID"]}}
        body = {"Pod": bind_pod, "NodeNames": ["gpu-0", "gpu-1"]}
        code, data = caller.post("/filter", json.dumps(body).encode())
        assert code == 200 and json.loads(data)["Error"] == "", data
        BIND["Node"] = json.loads(data)["NodeNames"][0]
        state = {"before_ms": filter_median_ms(caller, app, api)}
        yield app, caller, state, api
    finally:
        app.stop()
        api.close()


def _with(template: dict, path: tuple, value) -> dict:
    doc = json.loads(json.dumps(template))
    obj = doc
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return doc


@FUZZ
@given(body=mutated(FILTER), verb=st.sampled_from(["/filter", "/prioritize"]))
@example(body=_with(FILTER, ("Pod", "spec"), None), verb="/filter")
@example(body=_with(FILTER, ("Pod", "metadata"), None), verb="/filter")
def test_extender_args_mutations(stack, body, verb):
    stack[1].check(verb, json.dumps(body).encode())


@FUZZ
@given(annotations=st.dictionaries(st.sampled_from(ANNOTATION_KEYS), quantity_text | st.text(max_size=40),
                                   max_size=4),
       limits=st.dictionaries(st.sampled_from(RESOURCE_KEYS), quantity_text | json_value, max_size=4))
def test_hostile_annotations_and_quantities(stack, annotations, limits):
    """The hostile values are in the API's pod, where the extender reads them (the simulated API server
    stores any quantity; a real one refuses malformed ones at create, so this is defence in depth). The
    body is a well-formed copy of the template under the new pod's identity, as a kube-scheduler whose
    view is older than the API's would send: it passes the shape check, so the pod state is parsed."""
    _app, caller, _state, api = stack
    hostile = json.loads(json.dumps(POD))
    hostile["metadata"]["name"] = f"hostile-{next(_HOSTILE)}"
    hostile["metadata"]["annotations"] = annotations
    hostile["spec"]["containers"][0]["resources"] = {"limits": limits}
    created = create_pod(api, hostile)
    try:
        body = json.loads(json.dumps(POD))
        body["metadata"].update(name=hostile["metadata"]["name"], uid=created["metadata"]["uid"])
        code = caller.check("/filter", json.dumps({"Pod": body, "NodeNames": ["gpu-0", "gpu-1"]}).encode())
        assert code == 200
    finally:
        api.delete("Pod", "default", hostile["metadata"]["name"])


_HOSTILE = itertools.count()


@FUZZ
@given(body=mutated(BIND))
def test_binding_args_mutations(stack, body):
    stack[1].check("/bind", json.dumps(body).encode())


@FUZZ
@given(body=mutated(REVIEW))
# found by this suite: "spec": null reached the webhook's setdefault() and answered 500
@example(body=_with(REVIEW, ("request", "object", "spec"), None))
@example(body=_with(REVIEW, ("request", "object", "metadata"), None))
def test_admission_review_mutations(stack, body):
    stack[1].check("/webhook", json.dumps(body).encode())


@FUZZ
@given(body=mutated(VALIDATE))
def test_validation_review_mutations(stack, body):
    stack[1].check("/validate", json.dumps(body).encode())


@settings(max_examples=80, deadline=None, database=None)
@given(raw=st.binary(max_size=512) | st.text(max_size=256).map(str.encode),
       path=st.sampled_from(["/filter", "/prioritize", "/bind", "/webhook", "/validate"]))
def test_arbitrary_bytes(stack, raw, path):
    code = stack[1].check(path, raw)
    assert code in (200, 400)


# ---------------------------------------------------------------- names (issue 27 item 5): always a 400
# Every name a body carries, per endpoint, with the rule it must follow (namespaces are DNS-1123 labels).
NAME_FIELDS = [
    ("/filter", FILTER, ("Pod", "metadata", "name"), subdomain_error),
    ("/filter", FILTER, ("Pod", "metadata", "namespace"), label_error),
    ("/filter", FILTER, ("Pod", "metadata", "uid"), uid_error),
    ("/filter", FILTER, ("NodeNames", 1), subdomain_error),
    ("/filter", {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "gpu-0"}}]}},
     ("Nodes", "items", 0, "metadata", "name"), subdomain_error),
    ("/prioritize", FILTER, ("NodeNames", 0), subdomain_error),
    ("/bind", BIND, ("PodName",), subdomain_error),
    ("/bind", BIND, ("PodNamespace",), label_error),
    ("/bind", BIND, ("PodUID",), uid_error),
    ("/bind", BIND, ("Node",), subdomain_error),
    ("/webhook", REVIEW, ("request", "namespace"), label_error),
    ("/webhook", _with(REVIEW, ("request", "name"), "fuzz"), ("request", "name"), subdomain_error),
    ("/webhook", REVIEW, ("request", "object", "metadata", "name"), subdomain_error),
    ("/webhook", _with(REVIEW, ("request", "object", "metadata", "namespace"), "default"),
     ("request", "object", "metadata", "namespace"), label_error),
    ("/validate", VALIDATE, ("request", "namespace"), label_error),
    ("/validate", VALIDATE, ("request", "name"), subdomain_error),
]
_FIELD_IDS = [f"{p} {'.'.join(map(str, f))}" for p, _t, f, _c in NAME_FIELDS]
_PLACEHOLDER = "@@NAME@@"


def _assert_refused(caller: Caller, path: str, raw: bytes, what: str) -> None:
    code, data = caller.post(path, raw)
    assert code == 400, f"{path} {what}: answered {code} {data[:300]!r}"
    assert json.loads(data)["error"], data


@pytest.mark.parametrize("case", range(len(NAME_FIELDS)), ids=_FIELD_IDS)
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(value=bad_name)
@example(value="fuzz\ud800")  # the 500 of issue 27 item 5 (quote() in the API path builder)
def test_a_malformed_name_is_a_400_on_every_endpoint(stack, case, value):
    path, template, field, check = NAME_FIELDS[case]
    assume(check(value) is not None)  # e.g. a 64-character name is a fine pod name, not a namespace
    _assert_refused(stack[1], path, json.dumps(_with(template, field, value)).encode(), f"{field}={value!r}")


@pytest.mark.parametrize("case", range(len(NAME_FIELDS)), ids=_FIELD_IDS)
@settings(max_examples=7, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=non_utf8)
def test_a_name_that_is_not_utf8_is_a_400_on_every_endpoint(stack, case, raw):
    path, template, field, _check = NAME_FIELDS[case]
    body = json.dumps(_with(template, field, _PLACEHOLDER)).encode().replace(_PLACEHOLDER.encode(), raw)
    _assert_refused(stack[1], path, body, f"{field}={raw!r}")


# last: the fuzzing above left nothing behind
def test_alive_and_latency_unchanged_after_fuzzing(stack):
    app, caller, state, api = stack
    assert caller.statuses and max(caller.statuses) < 500
    after = filter_median_ms(caller, app, api)
    # generous: the machine is shared; a leak or a stuck thread shows as a multiple, not a few percent
    assert after < 3 * state["before_ms"] + 5.0, (state["before_ms"], after)
    conn = http.client.HTTPConnection("127.0.0.1", app.server.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
    assert app.server.stats.errors == 0  # no handler raised an unexpected exception
