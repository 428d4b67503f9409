"""Only kube-scheduler may call /filter, /prioritize and /bind (issue 14 finding 2): each
``--extender-auth`` mode refuses an unauthenticated caller with 401/403 naming the mode and what was
missing, and the handler is never called (nothing decided, nothing written)."""

from __future__ import annotations

import http.client
import json
import logging
import ssl

import pytest

from hami_agent.httpserve import Request
from hami_agent.k8s.client import KubeClient
from hami_agent.scheduler.serve import cmd as scheduler_cmd
from hami_agent.scheduler.serve.auth import AuthConfig, LoopbackAuth
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from tests.integration.scheduler.pki import make_pki
from tests.sim import apiserver_reviews
from tests.unit.scheduler.helpers import gpu_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FILTER = json.dumps({"Pod": gpu_pod("p1", mem=100), "NodeNames": ["n1"]}).encode()
BIND = json.dumps({"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "n1"}).encode()
SCHED_USER = "system:serviceaccount:kube-system:hami-extender-proxy"


class RecordingExtender:
    """Stands in for the extender: records every call that got past authentication."""

    def __init__(self, client=None):
        self.client = client
        self.calls: list[str] = []

    def filter(self, args):
        self.calls.append("filter")
        return {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None, "FailedAndUnresolvableNodes": None,
                "Error": ""}

    def bind(self, args):
        self.calls.append("bind")
        return {"Error": ""}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def call(port, path, body=b"", *, ctx=None, headers=None, method="POST"):
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10) if ctx
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.request(method, path, body or None, {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode(), dict(r.getheaders())
    finally:
        conn.close()


def client_ctx(pki, pair=None):
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    if pair is not None:
        ctx.load_cert_chain(pair.cert, pair.key)
    return ctx


# -- loopback
def test_loopback_refuses_a_non_loopback_verb_listener():
    with pytest.raises(ValueError, match="--extender-auth=loopback .* --bind-address is 0.0.0.0.*"
                                         "--extender-bind-address 127.0.0.1:PORT"):
        ExtenderHTTPServer(RecordingExtender(), None, host="0.0.0.0", auth=AuthConfig("loopback"))
    with pytest.raises(ValueError, match="--extender-bind-address is 0.0.0.0"):
        ExtenderHTTPServer(RecordingExtender(), None, host="127.0.0.1", extender_bind=("0.0.0.0", 0))


def test_cmd_exits_2_naming_the_flag(api_server, caplog):
    args = scheduler_cmd_args("--kubeconfig", api_server.kubeconfig_path, "--bind-address", "0.0.0.0:0",
                              "--metrics-bind", "")
    with caplog.at_level(logging.ERROR):
        assert scheduler_cmd.run(args) == 2
    assert "--extender-bind-address 127.0.0.1:PORT" in caplog.text


def scheduler_cmd_args(*argv):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig")
    p.add_argument("--config")
    scheduler_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def test_loopback_split_listeners(pki):
    """The webhook listener (all addresses, TLS) does not serve the verbs; the loopback one does."""
    ext = RecordingExtender()
    srv = ExtenderHTTPServer(ext, Webhook(SchedulerConfig()), host="0.0.0.0", port=0,
                             cert_file=pki.server.cert, key_file=pki.server.key,
                             extender_bind=("127.0.0.1", 0), auth=AuthConfig("loopback")).start()
    try:
        ctx = client_ctx(pki)
        for path, body in (("/filter", FILTER), ("/bind", BIND), ("/prioritize", FILTER)):
            code, _, _ = call(srv.port, path, body, ctx=ctx)
            assert code == 404
        assert ext.calls == []
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "r1", "operation": "CREATE", "object": gpu_pod("w", mem=100)}}
        code, body, _ = call(srv.port, "/webhook", json.dumps(review).encode(), ctx=ctx)
        assert code == 200 and json.loads(body)["response"]["uid"] == "r1"
        assert call(srv.port, "/healthz", ctx=ctx, method="GET")[0] == 200
        assert srv.extender_url.startswith("http://127.0.0.1:")
        code, body, _ = call(srv.extender_port, "/filter", FILTER)
        assert code == 200 and json.loads(body)["NodeNames"] == ["n1"]
        assert call(srv.extender_port, "/bind", BIND)[0] == 200
        assert call(srv.extender_port, "/webhook", b"{}")[0] == 404  # the webhook is not on the loopback one
        assert ext.calls == ["filter", "bind"]
    finally:
        srv.stop()


def test_loopback_peer_check_is_defence_in_depth():
    req = Request("POST", "/filter", "", {}, b"{}", ("10.0.0.5", 40000), "extender")
    with pytest.raises(Exception, match="loopback: /filter is served to local callers only") as exc:
        LoopbackAuth().check(req, "filter")
    assert exc.value.status == 403


# -- mtls
@pytest.fixture
def mtls_server(pki):
    ext = RecordingExtender()
    srv = ExtenderHTTPServer(ext, None, host="127.0.0.1", cert_file=pki.server.cert, key_file=pki.server.key,
                             auth=AuthConfig("mtls", client_ca_file=pki.ca.cert,
                                             allowed_cns=("kube-scheduler",))).start()
    yield srv, ext
    srv.stop()


def test_mtls_without_client_certificate_is_401(pki, mtls_server):
    srv, ext = mtls_server
    for path, body in (("/filter", FILTER), ("/bind", BIND), ("/prioritize", FILTER)):
        code, text, headers = call(srv.port, path, body, ctx=client_ctx(pki))
        assert code == 401 and "--extender-auth=mtls" in text and "client certificate" in text
    assert ext.calls == []
    assert call(srv.port, "/healthz", ctx=client_ctx(pki), method="GET")[0] == 200  # read-only stays open


def test_mtls_with_kube_schedulers_certificate_is_200(pki, mtls_server):
    srv, ext = mtls_server
    ctx = client_ctx(pki, pki.scheduler_client)
    assert call(srv.port, "/filter", FILTER, ctx=ctx)[0] == 200
    assert call(srv.port, "/bind", BIND, ctx=ctx)[0] == 200
    assert ext.calls == ["filter", "bind"]


def test_mtls_other_cn_is_403(pki, mtls_server):
    srv, ext = mtls_server
    code, text, _ = call(srv.port, "/bind", BIND, ctx=client_ctx(pki, pki.other_client))
    assert code == 403 and "'intruder' is not in --extender-allowed-cns" in text
    assert ext.calls == []


def test_mtls_certificate_from_another_ca_is_refused(pki, mtls_server):
    srv, ext = mtls_server
    with pytest.raises((ssl.SSLError, ConnectionError)):
        call(srv.port, "/filter", FILTER, ctx=client_ctx(pki, pki.rogue_client))
    assert ext.calls == []
    assert call(srv.port, "/healthz", ctx=client_ctx(pki), method="GET")[0] == 200


def test_mtls_needs_tls_and_a_ca(pki):
    with pytest.raises(ValueError, match="mtls needs TLS: set --cert-file, --key-file and --client-ca-file"):
        ExtenderHTTPServer(RecordingExtender(), None, auth=AuthConfig("mtls"))
    with pytest.raises(ValueError, match="mtls needs --client-ca-file"):
        ExtenderHTTPServer(RecordingExtender(), None, cert_file=pki.server.cert, key_file=pki.server.key,
                           auth=AuthConfig("mtls"))


# -- token
@pytest.fixture
def token_server(api_server):
    table = apiserver_reviews.configure(
        api_server,
        tokens={"sched-token": {"username": SCHED_USER, "groups": ["system:serviceaccounts"]},
                "tenant-token": {"username": "alice", "groups": ["tenants"]}},
        allow={(SCHED_USER, "create", "hami.io", "schedulerextenders", "*", "hami-scheduler")})
    client = KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=5)
    ext = RecordingExtender(client)
    srv = ExtenderHTTPServer(ext, None, auth=AuthConfig("token", deny_ttl_s=0.5)).start()
    yield srv, ext, table
    srv.stop()


def test_token_missing_or_unknown_is_401(token_server):
    srv, ext, _table = token_server
    code, text, headers = call(srv.port, "/filter", FILTER)
    assert code == 401 and "--extender-auth=token" in text and "Authorization: Bearer" in text
    assert headers.get("WWW-Authenticate") == "Bearer"
    code, text, _ = call(srv.port, "/bind", BIND, headers={"Authorization": "Bearer nope"})
    assert code == 401 and "did not authenticate" in text
    assert ext.calls == []


def test_token_without_rbac_grant_is_403(token_server):
    srv, ext, _table = token_server
    code, text, _ = call(srv.port, "/bind", BIND, headers={"Authorization": "Bearer tenant-token"})
    assert code == 403 and "user 'alice' may not create schedulerextenders/bind" in text
    assert ext.calls == []


def test_token_allowed_and_cached(token_server):
    srv, ext, table = token_server
    auth = {"Authorization": "Bearer sched-token"}
    assert call(srv.port, "/filter", FILTER, headers=auth)[0] == 200
    assert call(srv.port, "/bind", BIND, headers=auth)[0] == 200
    n = len(table.calls)
    sar = [spec for kind, spec in table.calls if kind == "SubjectAccessReview"]
    assert sar[0]["resourceAttributes"] == {
        "group": "hami.io", "resource": "schedulerextenders", "subresource": "filter", "verb": "create",
        "name": "hami-scheduler"}
    assert call(srv.port, "/filter", FILTER, headers=auth)[0] == 200
    assert len(table.calls) == n  # answered from the cache
    assert ext.calls == ["filter", "bind", "filter"]


def test_token_review_failure_is_503_and_not_cached(api_server, token_server):
    srv, ext, _table = token_server
    api_server.inject_fault(500, method="POST", path_regex="tokenreviews", times=5)
    code, text, headers = call(srv.port, "/filter", FILTER, headers={"Authorization": "Bearer sched-token"})
    assert code == 503 and "TokenReview failed" in text and headers.get("Retry-After") == "1"
    api_server.clear_faults()
    assert call(srv.port, "/filter", FILTER, headers={"Authorization": "Bearer sched-token"})[0] == 200


def test_token_over_plain_http_on_the_network_is_refused():
    with pytest.raises(ValueError, match="bearer tokens in clear text"):
        ExtenderHTTPServer(RecordingExtender(client=object()), None, host="0.0.0.0",
                           auth=AuthConfig("token"))


def test_token_mode_on_its_own_listener_speaks_tls(pki, api_server):
    """With --extender-bind-address, the verbs listener of mtls/token uses the TLS certificate too
    (tokens never travel in clear text), while loopback mode's stays plain HTTP on 127.0.0.1."""
    apiserver_reviews.configure(api_server, tokens={"t": {"username": SCHED_USER}},
                                allow={(SCHED_USER, "*", "*", "*", "*", "*")})
    ext = RecordingExtender(KubeClient.from_kubeconfig(api_server.kubeconfig_path, timeout_s=5))
    srv = ExtenderHTTPServer(ext, None, host="127.0.0.1", cert_file=pki.server.cert, key_file=pki.server.key,
                             extender_bind=("127.0.0.1", 0), auth=AuthConfig("token")).start()
    try:
        assert srv.extender_url.startswith("https://")
        code, _, _ = call(srv.extender_port, "/filter", FILTER, ctx=client_ctx(pki),
                          headers={"Authorization": "Bearer t"})
        assert code == 200 and ext.calls == ["filter"]
    finally:
        srv.stop()


def test_profiling_only_on_loopback_listeners(pki):
    srv = ExtenderHTTPServer(RecordingExtender(), None, host="0.0.0.0", cert_file=pki.server.cert,
                             key_file=pki.server.key, extender_bind=("127.0.0.1", 0),
                             profiling_enabled=True).start()
    try:
        assert call(srv.port, "/debug/pprof/goroutine", ctx=client_ctx(pki), method="GET")[0] == 404
        code, text, _ = call(srv.extender_port, "/debug/pprof/goroutine", method="GET")
        assert code == 200 and "thread " in text
    finally:
        srv.stop()
