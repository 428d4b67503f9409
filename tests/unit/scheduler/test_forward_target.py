"""Forwarding to a verified leader only (issue 27 item 4). Whoever can update the scheduler's Lease used to
be able to name any holder and ``hami.io/extender-url: http://<anywhere>``: every follower sent
kube-scheduler's /filter and /bind bodies there in clear text and returned the answers. Now a follower
forwards only over https, verified against the forward CA, to a configured replica or a URL whose
certificate must name the Lease holder; anything else is a 503, an event, and nothing sent."""

from __future__ import annotations

import pytest

from hami_agent.httpserve import HTTPError
from hami_agent.scheduler.verbs.leadership import (
    URL_ANNOTATION,
    ForwardRefused,
    ForwardSettings,
    LeaderGate,
    advertise_identity,
    forward_target,
    holder_host,
    normalize_url,
)
from tests.unit.scheduler.test_consistency import FakeElector, FakeForwarder

pytestmark = pytest.mark.unit

CA = ForwardSettings(ca_file="/etc/hami/pki/ca.crt")
UUID = "3f2b8c1e-5a6d-4e7f-9a0b-1c2d3e4f5a6b"


def test_holder_host_is_the_identity_before_its_uuid():
    assert holder_host(f"control-1_{UUID}") == "control-1"
    assert holder_host(f"Control-1.Example.COM_{UUID}") == "control-1.example.com"
    assert holder_host("replica-0") == "replica-0"
    assert holder_host("10.0.0.7") == "10.0.0.7"
    assert holder_host("evil_not-a-uuid") is None  # '_' is no DNS character
    assert holder_host(f"a b_{UUID}") is None
    assert holder_host(f"x\ud800_{UUID}") is None
    assert advertise_identity("https://Control-1:9443").startswith("control-1_")


def test_normalize_url():
    assert normalize_url("https://Host:443/") == "https://host:443"
    assert normalize_url("https://host") == "https://host:443"
    assert normalize_url("https://[::1]:9443") == "https://[::1]:9443"
    for bad in ("https://host/path", "https://u:p@host", "https://host?x=1", "ftp://host", "host:9443",
                "https://host:99999", ""):
        assert normalize_url(bad) is None, bad


@pytest.mark.parametrize("url, why", [
    ("http://evil.example:80", "not https"),
    ("http://127.0.0.1:9443", "not https"),
    ("https://evil.example/steal", "is not scheme://host"),
    ("", "published no"),
])
def test_unverifiable_urls_are_refused(url, why):
    with pytest.raises(ForwardRefused, match=why):
        forward_target(url, f"control-1_{UUID}", CA)


def test_no_forward_ca_means_no_forwarding():
    with pytest.raises(ForwardRefused, match="forward-ca-file"):
        forward_target("https://control-1:9443", f"control-1_{UUID}", ForwardSettings())


def test_a_configured_peer_needs_no_holder_check_another_url_must_name_the_holder():
    peers = ForwardSettings(ca_file="ca.crt", peers=("https://control-1:9443", "https://control-2:9443/"))
    assert forward_target("https://CONTROL-2:9443", "anyone", peers) == ("https://control-2:9443", None)
    # not a peer: its certificate must name the holder's host
    assert forward_target("https://10.0.0.9:9443", f"control-3_{UUID}", peers) == (
        "https://10.0.0.9:9443", "control-3")
    with pytest.raises(ForwardRefused, match="names no host"):
        forward_target("https://10.0.0.9:9443", "not a host", peers)


def _gate(url: str, holder: str = f"control-2_{UUID}", settings: ForwardSettings = CA):
    fwd = FakeForwarder(settings)
    gate = LeaderGate()
    el = FakeElector(False, holder=holder, url=url)
    gate.attach(el, fwd)
    refused: list[tuple[str, str, str]] = []
    gate.on_refused = lambda why, u, h: refused.append((why, u, h))
    return gate, fwd, refused


def test_a_lease_pointing_at_a_clear_text_url_gets_503_an_event_and_nothing_sent():
    """The issue's attack: the Lease writer sets holder and URL; nothing may reach that URL."""
    gate, fwd, refused = _gate("http://attacker.example:8080", holder="attacker")
    assert not gate.can_forward()  # /readyz says not ready
    with pytest.raises(HTTPError) as info:
        gate.forward("filter", {"Pod": {}}, lambda e: {"Error": e})
    assert info.value.status == 503 and "nothing was sent" in info.value.message
    assert ("Retry-After", "5") in info.value.headers
    assert fwd.calls == []
    assert len(refused) == 1 and "not https" in refused[0][0] and refused[0][2] == "attacker"
    assert gate.refused == 1


def test_a_verified_leader_is_forwarded_to_with_its_name_required():
    gate, fwd, refused = _gate("https://control-2:9443")
    assert gate.can_forward()
    assert gate.forward("bind", {"PodName": "p"}, lambda e: {"Error": e})["from"] == "leader"
    assert fwd.calls[0][0] == "https://control-2:9443" and fwd.names == ["control-2"]
    assert refused == []


def test_a_tls_failure_at_the_leader_is_a_refusal_too():
    gate, fwd, refused = _gate("https://control-2:9443")

    def bad_cert(url, verb, body, expect_name=None):
        raise ForwardRefused("the certificate of https://control-2:9443 does not verify")

    fwd.post = bad_cert
    with pytest.raises(HTTPError) as info:
        gate.forward("filter", {}, lambda e: {"Error": e})
    assert info.value.status == 503 and len(refused) == 1


def test_the_url_annotation_is_what_the_lease_says():
    assert URL_ANNOTATION == "hami.io/extender-url"


def test_a_leader_that_drops_the_handshake_is_a_failed_call_not_a_refusal():
    """A SIGKILLed leader's port (or one closing as it dies) ends the TLS handshake with EOF or a reset:
    a failed call to retry, not a certificate that lies (no refusal, no ForwardingRefused event)."""
    import socket
    import threading

    from hami_agent.scheduler.verbs.leadership import Forwarder

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def close_each():
        for _ in range(4):
            try:
                conn, _addr = srv.accept()
            except OSError:
                return
            conn.recv(1024)  # the ClientHello, then the leader "dies"
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    fwd = Forwarder(ForwardSettings(timeout_s=3.0))
    try:
        with pytest.raises(RuntimeError) as info:
            fwd.post(f"https://127.0.0.1:{port}", "filter", {})
        assert not isinstance(info.value, ForwardRefused)
    finally:
        fwd.close()
        srv.close()
