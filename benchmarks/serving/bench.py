"""The listener under attack, per HTTP server: the evidence behind hami_agent.httpserve (docs/scheduler.md,
"Serving"). Each server runs in its own process with a JSON POST route and GET /healthz; the attacks:

- idle TLS: a TCP connection that never sends a ClientHello, then GET /healthz over TLS (5 s client
  timeout), then how long until the server closes the idle socket;
- slowloris: request headers one line per second; when does the server close?
- slow body: a 1,000-byte body, one byte per second; when does the server close?
- nesting bomb: a body of '[' x 100,000: the status, or how the connection ended;
- 2,000 idle plain connections, then GET /healthz, then how many the server closed within 13 s.

Servers: ``httpserve`` (ours, defaults of the scheduler) and ``stdlib`` (http.server.ThreadingHTTPServer,
what the agent used before) always; ``uvicorn``, ``hypercorn``, ``aiohttp``, ``cheroot`` when installed
(``pip install uvicorn httptools hypercorn aiohttp cheroot``), each with its own best settings. Figures are
printed, never asserted. Run: ``python -m benchmarks.serving.bench [--servers a,b]`` (~1.5 min a server).
Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

from benchmarks import goals

OPTIONAL = ("uvicorn", "hypercorn", "aiohttp", "cheroot")


def _answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
    if method == "GET" and path == "/healthz":
        return 200, b"ok"
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return 400, b'{"error":"bad json"}'
    return 200, json.dumps({"type": type(obj).__name__}).encode()


async def _asgi(scope, receive, send):  # uvicorn, hypercorn
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    code, out = _answer(scope["method"], scope["path"], body)
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def serve(name: str, port: int, cert: str | None, key: str | None) -> None:  # noqa: PLR0915 - one branch a server
    """Run server ``name`` on 127.0.0.1:``port`` (TLS when ``cert``) until killed."""
    if name == "httpserve":
        from hami_agent.scheduler.serve.server import ExtenderHTTPServer

        ExtenderHTTPServer(routes={"/filter": lambda args: {"ok": True}}, host="127.0.0.1", port=port,
                           cert_file=cert, key_file=key).start()
        while True:
            time.sleep(3600)
    elif name == "stdlib":
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _go(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                code, out = _answer(self.command, self.path, self.rfile.read(n) if n else b"")
                self.send_response(code)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _go  # noqa: N815

            def log_message(self, *a) -> None:
                return

        httpd = ThreadingHTTPServer(("127.0.0.1", port), H)
        httpd.daemon_threads = True
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)  # as the old extender did
        httpd.serve_forever()
    elif name == "uvicorn":
        import uvicorn

        kw = {"ssl_certfile": cert, "ssl_keyfile": key} if cert else {}
        uvicorn.run(_asgi, host="127.0.0.1", port=port, limit_concurrency=1000, timeout_keep_alive=5,
                    log_level="warning", **kw)
    elif name == "hypercorn":
        import asyncio

        from hypercorn.asyncio import serve as hserve
        from hypercorn.config import Config

        c = Config()
        c.bind = [f"127.0.0.1:{port}"]
        c.keep_alive_timeout, c.read_timeout, c.ssl_handshake_timeout = 5, 10, 10
        if cert:
            c.certfile, c.keyfile = cert, key
        asyncio.run(hserve(_asgi, c))
    elif name == "aiohttp":
        from aiohttp import web

        async def handler(request):
            code, out = _answer(request.method, request.path, await request.read())
            return web.Response(status=code, body=out)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        ctx = None
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
        web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, keepalive_timeout=5, print=None)
    elif name == "cheroot":
        from cheroot import wsgi
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        def app(environ, start_response):
            n = int(environ.get("CONTENT_LENGTH") or 0)
            code, out = _answer(environ["REQUEST_METHOD"], environ["PATH_INFO"],
                                environ["wsgi.input"].read(n) if n else b"")
            start_response(f"{code} X", [("Content-Length", str(len(out)))])
            return [out]

        s = wsgi.Server(("127.0.0.1", port), app, numthreads=10, timeout=10)
        if cert:
            s.ssl_adapter = BuiltinSSLAdapter(cert, key)
        s.start()


class Target:
    def __init__(self, name: str, port: int, pki: tuple[str, str]) -> None:
        self.name, self.port, self.pki = name, port, pki
        self.proc: subprocess.Popen | None = None

    def start(self, tls: bool) -> None:
        cmd = [sys.executable, "-m", "benchmarks.serving.bench", "--serve", self.name,
               "--port", str(self.port)]
        if tls:
            cmd += ["--cert", self.pki[0], "--key", self.pki[1]]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(150):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def request(port: int, tls: bool, method: str = "GET", path: str = "/healthz", body: bytes = b"",
            timeout: float = 5.0) -> str:
    t0 = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout)
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            s = ctx.wrap_socket(s)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        status = data.split(b" ", 2)[1].decode() if data else "closed, no answer"
        return f"{status} ({time.monotonic() - t0:.2f}s)"
    except Exception as exc:
        return f"{type(exc).__name__} ({time.monotonic() - t0:.1f}s)"


def trickle(port: int, head: bytes, drip: bytes, limit_s: float) -> str:
    """Send ``head``, then ``drip`` once a second; when did the server close (or answer)?"""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(head)
    s.settimeout(1.0)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit_s:
            try:
                s.sendall(drip)
                data = s.recv(4096)
                status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else ""
                return f"closed after {time.monotonic() - t0:.1f}s" + (f" ({status})" if status else "")
            except TimeoutError:
                continue
            except OSError:
                return f"closed after {time.monotonic() - t0:.1f}s"
        return f"open after {limit_s:.0f}s"
    finally:
        s.close()


def attack(t: Target) -> dict[str, str]:
    res: dict[str, str] = {}
    t.start(tls=True)
    try:
        idle = socket.create_connection(("127.0.0.1", t.port))
        time.sleep(0.3)
        res["idle TLS: /healthz"] = request(t.port, True)
        res["idle TLS: socket"] = trickle_close(idle, 20)
    finally:
        t.stop()
    t.start(tls=False)
    try:
        res["slowloris"] = trickle(t.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n", b"X-a: b\r\n", 15)
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        res["slow body"] = trickle(t.port, head, b" ", 35)
        res["nesting bomb"] = request(t.port, False, "POST", "/filter", b"[" * 100_000)
        socks = []
        try:
            for _ in range(2000):
                socks.append(socket.create_connection(("127.0.0.1", t.port), 2))
        except OSError as exc:
            res["2,000 idle: connect"] = f"failed after {len(socks)}: {exc.strerror}"
        time.sleep(1)
        res["2,000 idle: /healthz"] = request(t.port, False)
        time.sleep(12)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        res["2,000 idle: closed in 13s"] = str(closed)
    finally:
        t.stop()
    return res


def trickle_close(s: socket.socket, limit_s: float) -> str:
    s.settimeout(0.5)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit_s:
            try:
                s.recv(4096)
                return f"closed after {time.monotonic() - t0:.1f}s"
            except TimeoutError:
                continue
            except OSError:
                return f"closed after {time.monotonic() - t0:.1f}s"
        return f"open after {limit_s:.0f}s"
    finally:
        s.close()


def make_pki(d: str) -> tuple[str, str]:
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="", help="comma-separated (default: httpserve, stdlib, and the "
                                                 "optional ones that are installed)")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cert", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    goals.add_flag(p)  # accepted for the runner: this benchmark prints no goal
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.cert, args.key)
        return 0
    if shutil.which("openssl") is None:
        print("the openssl command is needed for the TLS attack; skipped")
        return 0
    names = [n for n in args.servers.split(",") if n] or (
        ["httpserve", "stdlib"] + [n for n in OPTIONAL if importlib.util.find_spec(n) is not None])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        print(f"nofile hard limit {hard} < 2,200: the 2,000-connection attack will fail to connect")
    else:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096) if hard == resource.RLIM_INFINITY
                                                    else min(hard, max(soft, 4096)), hard))
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as d:
        pki = make_pki(d)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rows = {}
        for name in names:
            print(f"attacking {name} ...", flush=True)
            rows[name] = attack(Target(name, port, pki))
    cols = list(next(iter(rows.values())))
    print("\n| server | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(r.get(c, "") for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
