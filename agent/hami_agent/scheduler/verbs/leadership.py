"""Who may decide: with ``--leader-elect`` only the leader filters, binds and writes; a follower forwards
``/filter`` and ``/bind`` to the leader.

Why forward instead of answering an error: kube-scheduler runs its own leader election and calls the
extender next to it (``urlPrefix: https://127.0.0.1:...``, as the ``hami_scheduler`` role and HAMi's
chart configure it), so the active kube-scheduler is often next to a *follower* extender. A follower that
only answered errors would fail every pod until the two elections happened to agree.

* The leader publishes its extender URL (``--advertise-url``) as the Lease annotation
  ``hami.io/extender-url``, written in the same conditional update as the holder, so a follower that
  reads the Lease sees the URL of the holder it read.
* A forwarded request carries ``"HamiForwardedBy": <identity>`` in its body; a replica that is not the
  leader answers such a request with an error instead of forwarding it again (no forwarding loops while
  two replicas have stale views of the Lease). kube-scheduler retries the pod.
* **Fencing**: :meth:`LeaderGate.lease_valid` is checked right before every write (see
  ``LeaderElector.lease_valid``: a local monotonic deadline shorter than the lease), and every pod/node
  write the extender makes is conditional on the resourceVersion it read, so a deposed leader that has
  not noticed yet can neither start a write nor overwrite a newer decision.
* A replica that becomes leader relists its pod informer before it decides (``Informer.relist``): the
  previous leader's last annotations are in its cache before its first decision.

The forwarder is a bounded ``urllib3`` pool (already a dependency through the ``kubernetes`` client):
keep-alive, at most ``maxsize`` connections, connect/read timeouts, no retries (kube-scheduler retries
the pod). Its TLS settings come from ``client_ssl_context`` — the same client certificate the role gives
kube-scheduler works — so a forwarded call meets the leader's extender authentication like
kube-scheduler's own call does.

**Only to a verified leader** (issue 27 item 4). The Lease is a weak witness: whoever may update it (the
scheduler's own Role, and in many clusters other controllers with Lease rights in its namespace) can name
any holder and any URL, and every follower would send kube-scheduler's /filter and /bind bodies there and
hand the answers back to kube-scheduler. So a follower forwards only over https, verified against
``--forward-ca-file`` (never the system trust store, where anyone can get a certificate for a name they
own), to either a URL in ``--forward-peers`` (the replicas the operator configured) or a URL whose
certificate names the Lease holder's host (the part of its identity before ``_<uuid>``; a replica started
with ``--advertise-url`` takes that URL's host as its identity, so its serving certificate names it).
Anything else is refused before a byte is sent: HTTP 503 to kube-scheduler, a ``ForwardingRefused``
Warning event on the Lease, and the follower reports not ready. A Lease writer can still make the
followers refuse (they would not lead either way), but cannot read or answer kube-scheduler's calls.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hami_agent.protocol.names import subdomain_error

logger = logging.getLogger(__name__)

URL_ANNOTATION = "hami.io/extender-url"
FORWARDED_BY = "HamiForwardedBy"


class NotLeader(Exception):
    """This replica may not write (not the leader, or its lease could not be renewed in time)."""


class ForwardRefused(Exception):
    """The Lease names a leader this follower will not send kube-scheduler's requests to (the message says
    why); answered with HTTP 503 and a ``ForwardingRefused`` event."""


@dataclass(frozen=True)
class ForwardSettings:
    """How a follower reaches the leader's extender."""

    ca_file: str | None = None  # CA that signed the replicas' serving certificates (required to forward)
    cert_file: str | None = None  # client certificate for an extender that requires mTLS
    key_file: str | None = None
    timeout_s: float = 20.0  # below kube-scheduler's extender httpTimeout (HAMi's chart: 30s)
    max_connections: int = 8
    # the replicas' URLs (--forward-peers): forwarded to whichever the Lease names, without a holder check
    peers: tuple[str, ...] = ()


def normalize_url(url: str) -> str | None:
    """``https://Host:443/`` -> ``https://host:443``; None for anything that is not scheme://host[:port]."""
    try:
        u = urlsplit(url.strip())
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password or u.query \
            or u.fragment or u.path not in ("", "/"):
        return None
    host = u.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{host}:{port or (443 if u.scheme == 'https' else 80)}"


def holder_host(identity: str) -> str | None:
    """The host a Lease holder's identity names: ``<host>_<uuid>`` (client-go's and ours) -> ``<host>``, a
    bare identity -> itself; None when that is neither a DNS name nor an IP address."""
    host = identity
    head, sep, tail = identity.rpartition("_")
    if sep:
        try:
            uuid.UUID(tail)
            host = head
        except ValueError:
            pass
    host = host.lower()
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    return None if subdomain_error(host) else host


def forward_target(url: str | None, holder: str, settings: ForwardSettings) -> tuple[str, str | None]:
    """(URL to post to, host name its certificate must carry instead of the URL's, or None) for the leader
    the Lease names; ``ForwardRefused`` saying why when this follower may not forward there."""
    if not url:
        raise ForwardRefused(f"the Lease holder {holder or '(none)'} published no {URL_ANNOTATION}")
    norm = normalize_url(url)
    if norm is None:
        raise ForwardRefused(f"{URL_ANNOTATION} {url[:200]!r} is not scheme://host[:port]")
    if not norm.startswith("https://"):
        raise ForwardRefused(f"{URL_ANNOTATION} {url[:200]!r} is not https: kube-scheduler's requests are "
                             "never forwarded in clear text")
    if not settings.ca_file:
        raise ForwardRefused("no --forward-ca-file: a follower verifies the leader against the replicas' own "
                             "CA, never the system trust store")
    if norm in {normalize_url(p) for p in settings.peers}:
        return norm, None
    host = holder_host(holder)
    if host is None:
        raise ForwardRefused(f"{URL_ANNOTATION} {url[:200]!r} is not in --forward-peers and the Lease holder "
                             f"{holder[:100]!r} names no host its certificate could carry")
    return norm, host


def client_ssl_context(ca_file: str | None = None, cert_file: str | None = None,
                       key_file: str | None = None) -> ssl.SSLContext:
    """A verifying TLS client context, with a client certificate when given (for mTLS extenders)."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


class Forwarder:
    def __init__(self, settings: ForwardSettings | None = None) -> None:
        import urllib3

        self.settings = settings or ForwardSettings()
        s = self.settings
        self._pool = urllib3.PoolManager(
            num_pools=4, maxsize=s.max_connections, block=True, retries=False,
            timeout=urllib3.Timeout(connect=min(5.0, s.timeout_s), read=s.timeout_s),
            ssl_context=client_ssl_context(s.ca_file, s.cert_file, s.key_file))

    def post(self, url: str, verb: str, body: dict, expect_name: str | None = None) -> dict:
        """POST ``body`` to ``<url>/<verb>``; the decoded JSON object, or ``RuntimeError`` saying why not.
        ``expect_name``: the host name the server's certificate must carry (instead of the URL's host); a
        certificate that does not verify raises ``ForwardRefused``."""
        import urllib3

        if not url.startswith("https://"):
            raise ForwardRefused(f"{url[:200]!r} is not https: never forwarded in clear text")
        try:
            pool = self._pool.connection_from_url(
                url, pool_kwargs={"assert_hostname": expect_name} if expect_name else None)
            resp = pool.urlopen("POST", f"/{verb}", body=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"},
                                pool_timeout=self.settings.timeout_s, retries=False, redirect=False)
        except urllib3.exceptions.SSLError as exc:
            if not _verification_failed(exc):  # e.g. EOF in the handshake: a leader going away, not a lie
                raise RuntimeError(f"TLS handshake with {url[:200]} failed: {exc}") from exc
            raise ForwardRefused(f"the certificate of {url} does not verify against --forward-ca-file"
                                 + (f" for {expect_name}" if expect_name else "") + f": {exc}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.data[:200].decode('utf-8', 'replace')}")
        try:
            out = json.loads(resp.data)
        except ValueError as exc:
            raise RuntimeError(f"answer is not JSON: {exc}") from exc
        if not isinstance(out, dict):
            raise RuntimeError("answer is not a JSON object")
        return out

    def close(self) -> None:
        self._pool.clear()


def _verification_failed(exc: BaseException) -> bool:
    """Whether a TLS error is the peer's certificate failing verification (chain or name), as opposed to
    the connection failing during the handshake (a SIGKILLed leader's port answers EOF or a reset)."""
    import ssl

    seen: list[BaseException] = []
    todo: list[object] = [exc]
    while todo and len(seen) < 16:  # bounded: urllib3 wraps the ssl error once or twice
        e = todo.pop()
        if not isinstance(e, BaseException) or any(e is x for x in seen):
            continue
        seen.append(e)
        if isinstance(e, ssl.SSLCertVerificationError) or type(e).__name__ == "CertificateError":
            return True
        todo.extend([e.__cause__, e.__context__, *e.args])
    return False


def advertise_identity(advertise_url: str) -> str:
    """A Lease identity ``<host>_<uuid>`` whose host is the advertise URL's (client-go's form)."""
    host = (urlsplit(advertise_url).hostname or "").lower() or "replica"
    return f"{host}_{uuid.uuid4()}"


def default_advertise_url(host: str, port: int, tls: bool) -> str:
    """The URL followers use to reach this replica when ``--advertise-url`` is not given: the bind host,
    or this machine's FQDN when bound to all addresses (the ``hami_scheduler`` role's certificate has
    the host's inventory name among its SANs)."""
    import socket

    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - comparing, not binding
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


class LeaderGate:
    """Leadership as the extender sees it. Without an elector this replica always leads."""

    def __init__(self, elector: Any = None, forwarder: Forwarder | None = None,
                 relist: Callable[[float], bool] | None = None, relist_timeout_s: float = 60.0) -> None:
        self.elector = elector
        self.forwarder = forwarder
        # called with (why, url, holder) when a forward is refused (the app records an event on the Lease)
        self.on_refused: Callable[[str, str, str], None] | None = None
        self.refused = 0
        self._refused_target: tuple[str, str] | None = None  # (holder, url) refused at its TLS handshake
        self.relist = relist
        self._relist_timeout_s = relist_timeout_s
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._term = 0
        self._on_lost: list[Callable[[], None]] = []
        self._on_ready: list[Callable[[], None]] = []
        if elector is None:
            self._ready.set()
        self.forwarded = 0

    def attach(self, elector: Any, forwarder: Forwarder | None) -> None:
        """Use ``elector`` (created with this gate's ``started_leading``/``stopped_leading`` as its
        callbacks): until it leads and the caches are relisted, this replica does not decide."""
        self.elector = elector
        self.forwarder = forwarder
        self._ready.clear()

    @property
    def identity(self) -> str:
        return self.elector.identity if self.elector is not None else ""

    def on_lost(self, fn: Callable[[], None]) -> None:
        self._on_lost.append(fn)

    def on_ready(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` each time this replica becomes a leader that may decide (after the relist)."""
        self._on_ready.append(fn)

    # elector callbacks
    def started_leading(self) -> None:
        with self._lock:
            self._term += 1
            term = self._term
        ok = True
        if self.relist is not None:
            ok = self.relist(self._relist_timeout_s)
            if not ok:
                logger.error("leader: pod cache did not relist within %.0fs; not deciding yet",
                             self._relist_timeout_s)
        # the hooks (busy nodes, preemption holds rebuilt from the pending pods) run BEFORE this replica
        # decides: a filter answered in between would not see a previous leader's hold and could give its
        # room to a rival
        for fn in self._on_ready if ok and term == self._term and self.elector.is_leader() else ():
            try:
                fn()
            except Exception:
                logger.exception("leadership-ready hook failed")
        with self._lock:
            if ok and term == self._term and self.elector.is_leader():
                self._ready.set()
                logger.info("leader: caches relisted; deciding from now on")

    def stopped_leading(self) -> None:
        with self._lock:
            self._term += 1
            self._ready.clear()
        logger.warning("lost leadership: no more decisions or writes; forwarding to the new leader")
        for fn in self._on_lost:
            try:
                fn()
            except Exception:
                logger.exception("leadership-lost hook failed")

    # queries
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def wait_ready(self, timeout: float) -> bool:
        """Leader with relisted caches (waits up to ``timeout`` for the relist)."""
        return self.is_leader() and self._ready.wait(timeout) and self.is_leader()

    def lease_valid(self) -> bool:
        return self.elector is None or self.elector.lease_valid()

    def check(self, what: str) -> None:
        """Raise ``NotLeader`` unless this replica may write now; call right before each write."""
        if not self.lease_valid():
            raise NotLeader(f"not writing {what}: this replica is not the leader or could not renew its "
                            "lease in time (fencing); kube-scheduler will retry")

    def leader_url(self) -> str | None:
        if self.elector is None:
            return None
        holder = self.elector.leader()
        if not holder or holder == self.elector.identity:
            return None
        return self.elector.leader_annotation(URL_ANNOTATION)

    def _target(self) -> tuple[str, str | None, str]:
        """(url, name its certificate must carry, holder) of the leader, or ``ForwardRefused``."""
        holder = self.elector.leader() if self.elector is not None else ""
        settings = self.forwarder.settings if self.forwarder is not None else ForwardSettings()
        url, expect = forward_target(self.leader_url(), holder, settings)
        return url, expect, holder

    def can_forward(self) -> bool:
        """A leader is known and the Lease names a URL this follower may forward to."""
        url = self.leader_url()
        if self.forwarder is None or not url:
            return False
        try:
            self._target()
        except ForwardRefused:
            return False
        # a leader whose certificate did not verify stays refused until the Lease names another
        return self._refused_target != (self.elector.leader(), url)

    def forward(self, verb: str, args: dict, error: Callable[[str], dict]) -> dict:
        """Answer a follower's request through the leader (or an error kube-scheduler retries). A leader URL
        this follower may not forward to raises ``HTTPError`` 503 (``ForwardRefused``, with an event)."""
        if args.get(FORWARDED_BY):
            return error(f"not the leader (request forwarded by {args.get(FORWARDED_BY)!r}); the leadership "
                         "is changing: kube-scheduler will retry")
        url = self.leader_url()
        if self.forwarder is None or not url:
            holder = self.elector.leader() if self.elector is not None else ""
            return error(f"this extender replica is not the leader and cannot forward to the leader "
                         f"({holder or 'none elected yet'}; its {URL_ANNOTATION} is unknown): kube-scheduler "
                         "will retry")
        body = dict(args)
        body[FORWARDED_BY] = self.identity
        holder = self.elector.leader() if self.elector is not None else ""
        try:
            url, expect, holder = self._target()
            out = self.forwarder.post(url, verb, body, expect_name=expect)
        except ForwardRefused as exc:
            raise self._refuse(verb, str(exc), url, holder) from None
        except RuntimeError as exc:
            logger.warning("forwarding /%s to leader %s failed: %s", verb, url, exc)
            return error(f"forwarding /{verb} to the leader at {url} failed: {exc}")
        self.forwarded += 1
        return out

    def _refuse(self, verb: str, why: str, url: str, holder: str) -> Exception:
        from hami_agent.httpserve import HTTPError

        self.refused += 1
        self._refused_target = (holder, url)
        logger.error("REFUSING to forward /%s to %s (Lease holder %s): %s. Someone who can update the Lease "
                     "may be redirecting kube-scheduler's calls; check who wrote it", verb, url[:200],
                     holder[:100] or "(none)", why)
        if self.on_refused is not None:
            try:
                self.on_refused(why, url, holder)
            except Exception:
                logger.exception("recording the refused forward failed")
        return HTTPError(503, f"this extender replica is not the leader and refuses to forward /{verb} to "
                              f"the leader the Lease names ({url[:200]}): {why}; nothing was sent",
                         [("Retry-After", "5")])
