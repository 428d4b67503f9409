"""TLS contexts for the listeners (server side) and for callers of them (client side: tests, a
follower forwarding to the leader)."""

from __future__ import annotations

import ssl


def server_context(cert_file: str, key_file: str | None = None, client_ca_file: str | None = None,
                   ) -> ssl.SSLContext:
    """TLS 1.2+ server context. With ``client_ca_file`` a client certificate is *requested* and, when
    sent, verified against that CA (a wrong CA fails the handshake); whether one is *required* is
    decided per route, so /healthz and /metrics stay reachable without one and an extender verb
    without one gets a 401 that says what is missing instead of a bare TLS alert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file or None)
    ctx.set_alpn_protocols(["http/1.1"])  # never h2: the server speaks HTTP/1.1 only
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def common_name(cert: dict | None) -> str | None:
    """The subject CN of a certificate in ``getpeercert()`` form."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
