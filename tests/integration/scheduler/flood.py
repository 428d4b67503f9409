"""A flood of keep-alive TLS clients posting AdmissionReviews to ``/webhook`` (issue 27 item 2), run as its
own process so that its CPU and its interpreter lock are not the server's:

    python -m tests.integration.scheduler.flood --port 9443 --clients 200 --seconds 20 \\
        [--source 127.0.0.2 ...] [--out result.json]
    python -m tests.integration.scheduler.flood probe --port 9444 --pods p --count 2000

``probe`` is kube-scheduler's side: /filter calls one after another on one keep-alive connection (pods
``<pods>0`` .. ``<pods><count-1>``, which the test created), each line of its output ``[start (the system's
monotonic clock, shared by every process), milliseconds, HTTP status]``.

Each client opens one TLS connection (no certificate check: the attacker needs none) and sends requests
back to back, answering none of the server's idle hints: valid reviews of a GPU pod (the webhook mutates
them), mistyped ones (400), malformed JSON (400) and a review of a pod that names no node. Clients spread
over the ``--source`` addresses (several pod addresses; 127.0.0.x all reach the loopback), reconnect when
the server closes, and count the answers by status. The summary (JSON) goes to ``--out`` and stdout."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import time
from collections import Counter

LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "flood", "namespace": "default"},
       "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": LIMITS}}]}}


def _review(i: int) -> bytes:
    kind = i % 4
    if kind == 0:  # valid: a GPU pod, mutated
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": f"f-{i}", "operation": "CREATE", "namespace": "default", "object": POD}}
    elif kind == 1:  # valid shape, not a pod the webhook changes
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": f"f-{i}", "operation": "UPDATE", "namespace": "default", "object": POD}}
    elif kind == 2:  # mistyped: 400
        body = {"request": {"uid": f"f-{i}", "object": {"spec": {"containers": "x"}}}}
    else:  # not JSON: 400
        return b'{"request": {"uid": '
    return json.dumps(body).encode()


BODIES = [_review(i) for i in range(8)]


def _request(i: int) -> bytes:
    body = BODIES[i % len(BODIES)]
    return (b"POST /webhook HTTP/1.1\r\nHost: hami\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.lower() == "content-length":
            length = int(v.strip())
        elif k.lower() == "connection" and v.strip().lower() == "close":
            close = True
    if length:
        await reader.readexactly(length)
    return status, close


async def _client(n: int, host: str, port: int, source: str | None, ctx: ssl.SSLContext, until: float,
                  counts: Counter) -> None:
    i = n
    while time.monotonic() < until:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, ssl=ctx, server_hostname=None if ctx is None else "localhost",
                local_addr=(source, 0) if source else None), 10)
            counts["connections"] += 1
            while time.monotonic() < until:
                writer.write(_request(i))
                i += 1
                status, close = await asyncio.wait_for(_read_response(reader), 30)
                counts[str(status)] += 1
                if close:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ssl.SSLError, ValueError,
                asyncio.LimitOverrunError):
            counts["errors"] += 1
            await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


async def flood(host: str, port: int, clients: int, seconds: float, sources: list[str],
                tls: bool = True) -> dict:
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    counts: Counter = Counter()
    t0 = time.monotonic()
    until = t0 + seconds
    await asyncio.gather(*(_client(n, host, port, sources[n % len(sources)] if sources else None, ctx, until,
                                   counts) for n in range(clients)))
    elapsed = time.monotonic() - t0
    answered = sum(v for k, v in counts.items() if k.isdigit())
    return {"clients": clients, "seconds": round(elapsed, 2), "answered": answered,
            "per_s": round(answered / elapsed, 1), "counts": dict(counts)}


def probe_pod(name: str) -> dict:
    """The pod the probe filters (the test creates the same one in the extender's API first)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "x", "resources": {"limits": {
                         "nvidia.com/gpu": "1", "nvidia.com/gpumem": "10"}}}]},
            "status": {"phase": "Pending"}}


def probe(port: int, prefix: str, count: int, nodes: list[str], pause_s: float, seconds: float) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    until = time.monotonic() + seconds
    for i in range(count):
        body = json.dumps({"Pod": probe_pod(f"{prefix}{i}"), "NodeNames": nodes}).encode()
        t0 = time.monotonic()
        if t0 > until:
            break
        try:
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            status = r.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            status = 0  # no answer
        print(json.dumps([t0, (time.monotonic() - t0) * 1e3, status]), flush=True)
        time.sleep(pause_s)


def main() -> None:
    import sys

    if sys.argv[1:2] == ["probe"]:
        p = argparse.ArgumentParser(prog="flood probe")
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--pods", default="probe-")
        p.add_argument("--count", type=int, default=1000)
        p.add_argument("--node", action="append", default=[])
        p.add_argument("--pause", type=float, default=0.005)
        p.add_argument("--seconds", type=float, default=60)
        a = p.parse_args(sys.argv[2:])
        probe(a.port, a.pods, a.count, a.node or ["n0"], a.pause, a.seconds)
        return
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--source", action="append", default=[])
    p.add_argument("--plain", action="store_true", help="no TLS")
    p.add_argument("--out", default="")
    a = p.parse_args()
    result = asyncio.run(flood(a.host, a.port, a.clients, a.seconds, a.source, tls=not a.plain))
    text = json.dumps(result)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
