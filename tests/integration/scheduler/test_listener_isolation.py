"""Listeners that cannot starve each other (issue 27 item 2).

The webhook's listener must be reachable by the API server, so any pod can reach it too. It used to share
one request pool, queue and connection budget with kube-scheduler's loopback listener: 128 keep-alive TLS
clients posting valid AdmissionReviews to ``/webhook`` from a pod address made kube-scheduler's ``/filter``
get ``503 server busy`` for 13-22 of every 24-26 calls. Now each listener group has its own event loop,
connections, handler threads and queue; the public listener caps what one client address may hold
(connections, requests in flight: 429) and may admit only configured source ranges; and with the verbs on
a listener of their own the public listeners run in a process of their own (``public_process``, the
scheduler's default there: scheduler/serve/public.py), so that their threads cannot hold the interpreter
lock the verbs' threads wait for — in one process the flooded /filter p99 was 3.5x its quiet p99.

The flood test runs the flood (200 keep-alive TLS clients over four source addresses, valid, mistyped and
malformed AdmissionReviews back to back) in its own process at the lowest CPU priority: the attacker's CPU
is not the extender's host's in real life, and this machine has two shared cores. kube-scheduler's calls
come from another process too. The flood is switched on and off (SIGSTOP/SIGCONT) in 2 s windows while
/filter is called continuously. Judged here: never a 503 nor anything but 200, the verbs' pool never busy
nor refusing, the flood answered all along, requests beyond an address's cap parked. The latency under the
flood (its p99 against the quiet windows' p99 of the same run) is a performance figure: it is measured by
``python -m benchmarks webhook_flood`` and printed here, never judged by a timed test on a shared machine.
Before the fix: every /filter but one answered 503 and the p99 was 48 ms against 1.9 ms (2026-11-27).
``test_a_webhook_flood_never_makes_filter_answer_503`` floods the production arrangement (a process of
its own); ``benchmarks/webhook_flood`` measures both arrangements in one run."""

from __future__ import annotations

import contextlib
import http.client
import inspect
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_agent.httpserve import Limits

try:  # (the flood test runs against the server from before issue 27 too, where these do not exist)
    from hami_agent.httpserve.model import PeerLimits, parse_cidrs
except ImportError:  # pragma: no cover
    PeerLimits = parse_cidrs = None  # type: ignore[assignment,misc]
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.serve.webhook import Webhook
from hami_agent.scheduler.state.cache import UsageCache
from hami_agent.scheduler.verbs.extender import Extender, SchedulerConfig
from tests.integration.scheduler.flood import probe_pod
from tests.integration.scheduler.pki import make_pki
from tests.unit.scheduler.helpers import FakePodClient, dev

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
# the production arrangement: public listeners in a process of their own (absent before it existed)
PUBLIC_PROCESS = ({"public_process": True, "public_nice": 10}
                  if "public_process" in inspect.signature(ExtenderHTTPServer).parameters else {})
NODES = ["n0", "n1", "n2", "n3"]
SOURCES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]  # four pod addresses (all reach loopback)
WINDOW_S = 2.0
WINDOWS = 6  # off, on, off, on, off, on
SETTLE_S = 0.3  # samples this soon after a switch belong to neither window


def extender() -> Extender:
    """An extender over a fake API with room for thousands of pods (each /filter places one)."""
    cache = UsageCache()
    for n in NODES:
        cache.set_node(n, [dev(i, uuid=f"GPU-{n}-{i}", mem=81920, count=1_000_000) for i in range(8)])
    ext = Extender(cache, SchedulerConfig(write_behind=False), FakePodClient())
    ext.synced.set()
    return ext


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def collect(srv: ExtenderHTTPServer, ext: Extender, flood: subprocess.Popen, run: int,
            window_s: float = WINDOW_S, windows: int = WINDOWS) -> dict:
    """One run of ``windows`` windows (quiet first); the flood is stopped when it starts and left stopped.
    The /filter latencies (ms) of the flooded and the quiet windows, every status, the flood's requests;
    the raw samples ([send time, ms, status]) and ``window(t)`` (True flooded, False quiet, None neither)."""
    prefix = f"r{run}-"
    count = 4000
    for i in range(count):
        ext.client.add(probe_pod(f"{prefix}{i}"))
    os.kill(flood.pid, signal.SIGSTOP)
    switches: list[tuple[float, bool]] = []
    done = threading.Event()

    def toggle() -> None:
        on = False
        for _ in range(windows):
            os.kill(flood.pid, signal.SIGCONT if on else signal.SIGSTOP)
            switches.append((time.monotonic(), on))
            if done.wait(window_s):
                break
            on = not on
        os.kill(flood.pid, signal.SIGSTOP)

    public = getattr(srv, "public_stats", None) or srv.stats  # (one server for everything before issue 27)
    public_before = public.requests
    probe = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler.flood", "probe", "--port", str(srv.extender_port),
         "--pods", prefix, "--count", str(count), "--seconds", str(window_s * windows + 0.5)]
        + [a for n in NODES for a in ("--node", n)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    toggler = threading.Thread(target=toggle, daemon=True)
    toggler.start()
    out, _ = probe.communicate(timeout=window_s * windows + 30)
    done.set()
    toggler.join(5)
    samples = [json.loads(line) for line in out.splitlines() if line.strip()]

    def window(t: float) -> bool | None:
        current = None
        for at, on in switches:
            if at <= t:
                current = (at, on)
        return None if current is None or t - current[0] < SETTLE_S else current[1]

    codes: dict[int, int] = {}
    for _t, _ms, code in samples:
        codes[code] = codes.get(code, 0) + 1
    return {"on": [ms for t, ms, _code in samples if window(t) is True],
            "off": [ms for t, ms, _code in samples if window(t) is False], "codes": codes,
            "flood_requests": (getattr(srv, "public_stats", None) or srv.stats).requests - public_before,
            "samples": samples, "window": window}


def summary(on: list[float], off: list[float]) -> dict:
    return {"n_on": len(on), "n_off": len(off),
            "p50_off": round(pct(off, 0.5), 2), "p99_off": round(pct(off, 0.99), 2),
            "p50_on": round(pct(on, 0.5), 2), "p99_on": round(pct(on, 0.99), 2)}


def measure(srv: ExtenderHTTPServer, ext: Extender, flood: subprocess.Popen, run: int) -> dict:
    c = collect(srv, ext, flood, run)
    return {"run": run, "codes": c["codes"], **summary(c["on"], c["off"]),
            "flood_requests": c["flood_requests"]}


@contextlib.contextmanager
def flood_running(srv: ExtenderHTTPServer, clients: int, connect_s: float) -> Iterator[subprocess.Popen]:
    """The flood (``flood.py``: ``clients`` keep-alive TLS clients over SOURCES, at nice 19) against
    ``srv``'s public listener, once every client connected (or ``connect_s`` passed); ended on exit."""
    flood = subprocess.Popen(
        ["nice", "-n", "19", sys.executable, "-m", "tests.integration.scheduler.flood",
         "--port", str(srv.port), "--clients", str(clients), "--seconds", "600"]
        + [a for s in SOURCES for a in ("--source", s)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + connect_s
        while srv.stats.accepted < clients and time.monotonic() < end:
            time.sleep(0.1)
        yield flood
    finally:
        if flood.poll() is None:
            os.kill(flood.pid, signal.SIGCONT)  # measure() leaves it stopped
            flood.terminate()
            try:
                flood.wait(10)
            except subprocess.TimeoutExpired:
                flood.kill()


def test_a_webhook_flood_never_makes_filter_answer_503(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    ext = extender()
    srv = ExtenderHTTPServer(ext, Webhook(SchedulerConfig()), host="127.0.0.1", port=0,
                             cert_file=pki.server.cert, key_file=pki.server.key,
                             extender_bind=("127.0.0.1", 0), **PUBLIC_PROCESS).start()
    try:
        with flood_running(srv, 200, connect_s=20) as flood:
            assert srv.stats.accepted >= 200, srv.stats
            r = measure(srv, ext, flood, 0)
        r["load_per_cpu"] = round(os.getloadavg()[0] / (os.cpu_count() or 1), 1)
        print(f"\nflood run: {r} (p99 under the flood / quiet p99: {r['p99_on'] / r['p99_off']:.1f}x)")
        assert set(r["codes"]) == {200}, r  # never a 503, never anything but 200
        assert r["n_on"] >= 100 and r["n_off"] >= 100, r
        assert r["flood_requests"] > 1000, r  # the flood was on: the webhook answered it all along
        verbs = srv.verbs_stats
        assert verbs.busy == 0 and verbs.refused == 0 and verbs.errors == 0, verbs
        public = srv.public_stats
        assert public.parked > 0, public  # requests beyond an address's cap waited, unread
        assert public.errors == 0, public
    finally:
        srv.stop()
        ext.healer.stop()


# ------------------------------------------------------------------ the parts, one at a time, quickly
def _post(port: int, path: str, body: bytes, *, source: str | None = None, ctx: ssl.SSLContext | None = None,
          timeout: float = 10) -> tuple[int, bytes]:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout,
                                        source_address=(source, 0) if source else None) if ctx else
            http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                       source_address=(source, 0) if source else None))
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _filter_body(ext: Extender, name: str) -> bytes:
    ext.client.add(probe_pod(name))
    return json.dumps({"Pod": probe_pod(name), "NodeNames": NODES}).encode()


def test_the_verbs_keep_their_own_pool_when_they_share_the_webhooks_listener():
    """Without --extender-bind-address (mtls on one port, the sandbox) a stuck webhook still cannot take
    kube-scheduler's handler threads: the verbs run on a pool of their own."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def stuck(_args):
        started.release()
        release.wait(20)
        return {"ok": True}

    ext = extender()
    srv = ExtenderHTTPServer(ext, routes={"/slow": stuck},
                             limits=Limits(workers=1, max_queued=1, queue_wait_s=0.2)).start()
    threads = [threading.Thread(target=_post, args=(srv.port, "/slow", b"{}"), kwargs={"timeout": 30})
               for _ in range(2)]
    try:
        for t in threads:
            t.start()
        assert started.acquire(timeout=10)
        time.sleep(0.3)  # the second one is queued: the public pool is full
        assert _post(srv.port, "/slow", b"{}")[0] == 503
        code, body = _post(srv.port, "/filter", _filter_body(ext, "shared-0"))
        assert code == 200 and json.loads(body)["Error"] == "", body
    finally:
        release.set()
        for t in threads:
            t.join(30)
        srv.stop()
        ext.healer.stop()


def _slow_server(peers: PeerLimits, queue_wait_s: float = 5.0):
    release = threading.Event()
    running = threading.Semaphore(0)

    def slow(_args):
        running.release()
        release.wait(20)
        return {"ok": True}

    srv = ExtenderHTTPServer(routes={"/slow": slow}, peers=peers,
                             limits=Limits(workers=8, max_queued=8, queue_wait_s=queue_wait_s)).start()
    return srv, release, running


def _in_flight(srv, source: str, codes: list[int]) -> threading.Thread:
    t = threading.Thread(target=lambda: codes.append(_post(srv.port, "/slow", b"{}", source=source,
                                                           timeout=30)[0]))
    t.start()
    return t


def test_one_address_cannot_take_every_queue_slot():
    """Its requests beyond the cap wait (their connections unread) while another address is served; each
    starts when one of its own ends; past Limits.queue_wait_s a waiting one is answered 503."""
    srv, release, running = _slow_server(PeerLimits(max_connections=100, max_inflight=2), queue_wait_s=1.0)
    codes: list[int] = []
    held = []
    try:
        held = [_in_flight(srv, "127.0.0.2", codes) for _ in range(2)]  # its cap
        for _ in range(2):
            assert running.acquire(timeout=10)
        waiting = _in_flight(srv, "127.0.0.2", codes)  # waits for one of the two
        time.sleep(0.3)
        assert srv.public_stats.parked == 1 and not running.acquire(timeout=0.2)
        held.append(_in_flight(srv, "127.0.0.3", codes))  # another address: a handler is free for it
        assert running.acquire(timeout=10)
        waiting.join(5)  # nothing freed within queue_wait_s: 503
        assert codes == [503], codes
    finally:
        release.set()
        for t in held:
            t.join(30)
        srv.stop()
    assert sorted(codes) == [200, 200, 200, 503], codes


def test_a_waiting_request_starts_when_its_address_is_below_the_cap_again():
    srv, release, running = _slow_server(PeerLimits(max_connections=100, max_inflight=1))
    codes: list[int] = []
    try:
        first = _in_flight(srv, "127.0.0.2", codes)
        assert running.acquire(timeout=10)
        second = _in_flight(srv, "127.0.0.2", codes)
        time.sleep(0.3)
        assert not running.acquire(timeout=0.1)  # waiting, not refused
        release.set()
        first.join(10)
        assert running.acquire(timeout=10)  # started once the first one ended
        second.join(10)
    finally:
        release.set()
        srv.stop()
    assert codes == [200, 200], codes


def test_one_address_cannot_take_every_connection():
    srv, release, running = _slow_server(PeerLimits(max_connections=2, max_inflight=100))
    codes: list[int] = []
    held = []
    try:
        held = [_in_flight(srv, "127.0.0.2", codes) for _ in range(2)]  # two busy connections: its cap
        for _ in range(2):
            assert running.acquire(timeout=10)
        extra = socket.create_connection(("127.0.0.1", srv.port), source_address=("127.0.0.2", 0))
        extra.settimeout(5)
        data = extra.recv(4096)  # nothing of its own to evict: refused at once
        extra.close()
        assert data.startswith(b"HTTP/1.1 503 ") and b"too many connections from 127.0.0.2" in data, data
        assert srv.public_stats.peer_refused == 1
        held.append(_in_flight(srv, "127.0.0.3", codes))  # other addresses still connect
        assert running.acquire(timeout=10)
    finally:
        release.set()
        for t in held:
            t.join(30)
        srv.stop()
    assert codes == [200, 200, 200], codes


def test_an_idle_connection_of_the_same_address_makes_room_for_its_new_one():
    srv = ExtenderHTTPServer(routes={"/echo": lambda a: a}, peers=PeerLimits(max_connections=2)).start()
    try:
        idle = [socket.create_connection(("127.0.0.1", srv.port), source_address=("127.0.0.2", 0))
                for _ in range(2)]
        time.sleep(0.2)
        assert _post(srv.port, "/echo", b"{}", source="127.0.0.2")[0] == 200  # an idle one was evicted
        assert srv.public_stats.evicted >= 1 and srv.public_stats.peer_refused == 0
        for s in idle:
            s.close()
    finally:
        srv.stop()


def test_only_the_allowed_source_ranges_may_connect(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    allowed = PeerLimits(allowed_sources=parse_cidrs("127.0.0.2/32, 10.0.0.0/8"))
    srv = ExtenderHTTPServer(routes={"/echo": lambda a: a}, cert_file=pki.server.cert,
                             key_file=pki.server.key, peers=allowed).start()
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    try:
        assert _post(srv.port, "/echo", b'{"a":1}', source="127.0.0.2", ctx=ctx) == (200, b'{"a":1}')
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            _post(srv.port, "/echo", b"{}", source="127.0.0.3", ctx=ctx)  # closed before the handshake
        assert srv.public_stats.source_refused >= 1
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="--allowed-sources: 'nope'"):
        parse_cidrs("10.0.0.0/8,nope")
