"""The public listeners in a process of their own (``--public-listener-process``, scheduler/serve/public.py):
what they serve there is what they served in the scheduler's process — the webhook (with the quota and
namespace labels the scheduler process knows), /validate, health, readiness and metrics — on sockets the
scheduler process bound; a child that dies is started again on the same port; stopping leaves no process."""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
import urllib.request

import pytest

from hami_agent.httpserve import Limits
from hami_agent.scheduler.serve.metrics import SchedulerMetrics
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.flood import BODIES, probe_pod
from tests.integration.scheduler.pki import make_pki
from tests.integration.scheduler.test_listener_isolation import NODES, extender
from tests.sim.fixtures import api_server  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _call(url: str, path: str, body: bytes | None = None,
          ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, data=body, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_the_webhook_is_served_by_another_process_with_the_scheduler_s_answers(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    ext = extender()
    metrics = SchedulerMetrics(ext.cache)
    asked: list[str] = []
    ready = [False]

    def quota(ns):
        asked.append(ns)
        return (0, None)  # no memory left: a GPU pod is denied

    hook = Webhook(SchedulerConfig(), quota=quota, namespace_labels=lambda ns: {})
    srv = ExtenderHTTPServer(ext, hook, host="127.0.0.1", port=0, cert_file=pki.server.cert,
                             key_file=pki.server.key, registry=metrics.registry, metrics=metrics,
                             ready=lambda: ready[0], extender_bind=("127.0.0.1", 0),
                             metrics_bind=("127.0.0.1", 0), public_process=True,
                             limits=Limits(workers=2, max_queued=8)).start()
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    try:
        child = srv.public_pid
        assert child is not None and child != os.getpid()
        for _ in range(5):  # valid GPU pod reviews: the quota is asked once (kept a second), then denied
            code, body = _call(srv.url, "/webhook", BODIES[0], ctx)
            assert code == 200
            assert "exceeding resource quota" in json.loads(body)["response"]["status"]["message"]
        assert asked == ["default"]
        assert _call(srv.url, "/webhook", BODIES[2], ctx)[0] == 400  # the shapes are checked there too
        assert _call(srv.url, "/readyz", None, ctx)[0] == 503
        ready[0] = True
        time.sleep(0.6)  # the child keeps the answer half a second
        assert _call(srv.url, "/readyz", None, ctx)[0] == 200
        ext.client.add(probe_pod("pp-0"))
        args = json.dumps({"Pod": probe_pod("pp-0"), "NodeNames": NODES}).encode()
        code, body = _call(srv.extender_url, "/filter", args)
        assert code == 200 and json.loads(body)["Error"] == ""
        _call(srv.extender_url, "/filter", args)
        time.sleep(1.1)  # the scheduler's metrics text is kept a second
        for url in (srv.url, f"http://{srv._public_socks['metrics'].getsockname()[0]}:"
                             f"{srv._public_socks['metrics'].getsockname()[1]}"):
            code, text = _call(url, "/metrics", None, ctx if url.startswith("https") else None)
            assert code == 200
            assert b'hami_scheduler_request_duration_seconds_count{verb="webhook"} 5.0' in text, text
            assert b'hami_scheduler_request_duration_seconds_count{verb="filter"}' in text
        stats = srv.public_stats
        assert stats.requests >= 9 and stats.accepted >= 1 and srv.verbs_stats.requests == 2

        os.kill(child, signal.SIGKILL)  # a child that dies is started again, on the same socket
        end = time.monotonic() + 15
        while (srv.public_pid == child or srv._public.restarts == 0) and time.monotonic() < end:
            time.sleep(0.1)
        assert srv.public_pid != child
        assert _call(srv.url, "/healthz", None, ctx)[0] == 200
        child = srv.public_pid
    finally:
        srv.stop()
        ext.healer.stop()
    assert _gone(child)


def test_a_route_that_cannot_travel_is_refused_at_start():
    with pytest.raises(ValueError, match="cannot be served in their own process"):
        ExtenderHTTPServer(extender(), None, routes={"/echo": lambda a: a}, extender_bind=("127.0.0.1", 0),
                           public_process=True)


def test_the_scheduler_app_runs_it(api_server):  # noqa: F811
    """The real wiring (cmd's default with --extender-bind-address): config, guard and webhook travel."""
    from hami_agent.k8s.client import KubeClient
    from hami_agent.scheduler.serve.app import SchedulerApp

    app = SchedulerApp(KubeClient.from_kubeconfig(api_server.kubeconfig_path), SchedulerConfig(),
                       serving={"extender_bind": ("127.0.0.1", 0), "public_process": True})
    app.start()
    try:
        assert app.server.public_pid not in (None, os.getpid())
        code, body = _call(app.server.url, "/webhook", BODIES[0])
        assert code == 200 and json.loads(body)["response"]["allowed"] is True, body
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "v1", "operation": "CREATE", "namespace": "default", "object": {}}}
        code, body = _call(app.server.url, "/validate", json.dumps(review).encode())
        assert code in (200, 400), body
        assert _call(app.server.url, "/healthz")[0] == 200
    finally:
        app.stop()
