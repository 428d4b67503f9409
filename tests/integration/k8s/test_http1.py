"""The lean HTTP/1.1 client (``hami_agent.k8s.http1``) against scripted servers that answer the way real
ones can: chunked and Content-Length bodies, keep-alive, idle connections closed by the server, silence,
early close, junk, bodies delimited by close, and TLS with and without a client certificate. Every case
also checks what happens to the connection afterwards (reused or dropped)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hami_agent.k8s import KubeClient, KubeError, KubeTimeoutError, RetryPolicy, http1
from tests.integration.scheduler.pki import make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Script = Callable[[socket.socket, bytes, int], bool]  # (conn, request head, n-th request) -> keep going


class ScriptedServer:
    """Accepts connections and answers each request with ``script``; counts connections and requests."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self.tls_errors: list[str] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as e:
                self.tls_errors.append(str(e))
                conn.close()
                return
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                if not self.script(conn, head, len(self.requests)):
                    return

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def json_answer(payload: dict, *, chunk: int | None = None, status: str = "200 OK",
                extra: str = "") -> bytes:
    body = json.dumps(payload).encode()
    if chunk is None:
        return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Transfer-Encoding: chunked\r\n\r\n"
    parts = [out.encode()]
    for i in range(0, len(body), chunk):
        piece = body[i:i + chunk]
        parts.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def make(script: Script, tls: ssl.SSLContext | None = None) -> ScriptedServer:
        servers.append(ScriptedServer(script, tls))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


BIG = {"metadata": {"name": "p", "annotations": {f"a{i}": "x" * 100 for i in range(80)}}}


def test_content_length_and_chunked_bodies_on_one_kept_alive_connection(serve) -> None:
    def script(conn, head, n):
        conn.sendall(json_answer(BIG, chunk=4096 if n % 2 else None))
        return True

    srv = serve(script)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    for _ in range(4):
        r = pool.request("GET", "/api/v1/pods/p", {"Accept": "application/json"}, None, 1.0, 1.0)
        assert r.status == 200
        assert json.loads(r.read()) == BIG
    assert srv.connections == 1  # both framings keep the connection
    first = srv.requests[0].decode()
    assert first.startswith("GET /api/v1/pods/p HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n" in first
    assert "Content-Length" not in first  # a GET without a body, as urllib3 sends it


def test_an_answered_exchange_leaves_no_cycle_for_the_collector(serve) -> None:
    # the parser holds its exchange's bound callbacks: unbroken, every request left a cycle with the
    # answer's body pieces that only the cyclic collector frees (gen 2 for the long-lived ones)
    import gc

    def script(conn, head, n):
        conn.sendall(json_answer(BIG))
        return True

    srv = serve(script)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            assert pool.request("GET", "/api/v1/pods/p", {}, None, 1.0, 1.0).status == 200
        alive = sum(1 for o in gc.get_objects() if type(o) is http1._Exchange)
    finally:
        gc.enable()
    assert alive == 0


def test_request_body_headers_and_a_header_of_the_answer(serve) -> None:
    srv = serve(lambda conn, head, n: conn.sendall(json_answer(
        {"kind": "Status"}, status="429 Too Many Requests", extra="Retry-After: 3\r\n")) or True)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}/prefix/")
    r = pool.request("PATCH", "/api/v1/nodes/n1?fieldManager=x",
                     {"Content-Type": "application/merge-patch+json"}, b'{"a":1}', 1.0, 1.0)
    assert (r.status, r.getheader("retry-after"), r.getheader("RETRY-AFTER")) == (429, "3", "3")
    assert r.getheader("x-missing") is None
    sent = srv.requests[0]
    assert sent.startswith(b"PATCH /prefix/api/v1/nodes/n1?fieldManager=x HTTP/1.1\r\n")
    assert b"Content-Length: 7\r\n" in sent and sent.endswith(b'\r\n\r\n{"a":1}')


def test_an_idle_connection_the_server_closed_is_not_reused(serve) -> None:
    def script(conn, head, n):
        conn.sendall(json_answer({"n": n}))
        return False  # answered with keep-alive, then closed: what an API server's idle timeout does

    srv = serve(script)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    assert json.loads(pool.request("GET", "/a", {}, None, 1.0, 1.0).read()) == {"n": 1}
    time.sleep(0.1)  # the close reaches the client's idle socket
    assert json.loads(pool.request("GET", "/b", {}, None, 1.0, 1.0).read()) == {"n": 2}
    assert srv.connections == 2


def test_a_connection_on_a_descriptor_above_1024_is_reused(serve) -> None:
    """select() cannot look at descriptors above 1,024; a busy extender has them."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"needs 1,200 open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY
                                                else min(max(soft, 1200), hard), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        srv = serve(lambda conn, head, n: conn.sendall(json_answer({"n": n})) or True)
        pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
        for n in (1, 2, 3):
            assert json.loads(pool.request("GET", "/", {}, None, 1.0, 1.0).read()) == {"n": n}
        assert pool._idle[0].sock.fileno() > 1024
        assert srv.connections == 1
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connection_close_is_honoured_and_a_body_may_end_with_the_connection(serve) -> None:
    def script(conn, head, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b'{"till": "eof"}')
        return False

    srv = serve(script)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    for _ in range(2):
        assert json.loads(pool.request("GET", "/", {}, None, 1.0, 1.0).read()) == {"till": "eof"}
    assert srv.connections == 2


def test_silence_is_a_read_timeout_and_the_connection_is_dropped(serve) -> None:
    answered = threading.Event()

    def script(conn, head, n):
        if n == 1:
            time.sleep(1.0)  # longer than the client's read timeout
        conn.sendall(json_answer({"n": n}))
        answered.set()
        return True

    srv = serve(script)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    with pytest.raises(http1.ResponseTimeout):
        pool.request("GET", "/", {}, None, 1.0, 0.2)
    answered.wait(5)
    # the late answer to the first request must never be read as the answer to the second
    assert json.loads(pool.request("GET", "/", {}, None, 1.0, 1.0).read()) == {"n": 2}
    assert srv.connections == 2


@pytest.mark.parametrize(("wire", "message"), [
    (b"", "without answering"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"half\":", "before the answer was complete"),
    (b"SMTP ready\r\n\r\n", "malformed HTTP answer"),
])
def test_early_close_and_junk_are_protocol_errors(serve, wire: bytes, message: str) -> None:
    srv = serve(lambda conn, head, n: conn.sendall(wire) or False)
    pool = http1.Pool(f"http://127.0.0.1:{srv.port}")
    with pytest.raises(http1.ProtocolError, match=message):
        pool.request("GET", "/", {}, None, 1.0, 1.0)


def test_nothing_listening_is_a_connect_failure() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(http1.ConnectFailed, match=f"127.0.0.1:{port}"):
        http1.Pool(f"http://127.0.0.1:{port}").request("GET", "/", {}, None, 1.0, 1.0)


# -- TLS, through KubeClient as the agents use it

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_tls(pki, require_client: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki.ca.cert)
    ctx.load_cert_chain(pki.server.cert, pki.server.key)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_NONE
    return ctx


def kubeconfig(tmp_path: Path, port: int, pki, *, client=None, ca=None, insecure: bool = False) -> str:
    cluster = {"server": f"https://127.0.0.1:{port}"}
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    else:
        cluster["certificate-authority"] = (ca or pki.ca).cert
    user = {"client-certificate": client.cert, "client-key": client.key} if client else {"token": "t0ken"}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def answer_node(conn, head, n):
    conn.sendall(json_answer({"kind": "Node", "metadata": {"name": "n1"}, "n": n}, chunk=7))
    return True


def client_for(path: str) -> KubeClient:
    return KubeClient.from_kubeconfig(path, timeout_s=2.0, retry=RetryPolicy(attempts=1))


def test_tls_with_a_client_certificate(serve, pki, tmp_path) -> None:
    tls = server_tls(pki, require_client=True)
    tls.set_alpn_protocols(["h2", "http/1.1"])  # a server that speaks both gets HTTP/1.1, as asked
    srv = serve(answer_node, tls=tls)
    kube = client_for(kubeconfig(tmp_path, srv.port, pki, client=pki.scheduler_client))
    try:
        assert kube.get_node("n1")["n"] == 1
        assert kube._http1_pool()._idle[0].sock.selected_alpn_protocol() == "http/1.1"
        assert kube.get_node("n1")["n"] == 2
        assert kube._http1_pool() is not None  # the lean path served them
        assert srv.connections == 1
    finally:
        kube.close()


def test_tls_without_the_client_certificate_the_server_wants_fails_clearly(serve, pki, tmp_path) -> None:
    srv = serve(answer_node, tls=server_tls(pki, require_client=True))
    kube = client_for(kubeconfig(tmp_path, srv.port, pki))
    try:
        with pytest.raises(KubeError) as ei:
            kube.get_node("n1")
        assert ei.value.reason == "connection error"
    finally:
        kube.close()


def test_a_server_certificate_of_another_ca_is_refused_unless_verify_is_off(serve, pki, tmp_path) -> None:
    srv = serve(answer_node, tls=server_tls(pki, require_client=False))
    kube = client_for(kubeconfig(tmp_path, srv.port, pki, ca=pki.rogue_ca))
    try:
        with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
            kube.get_node("n1")
    finally:
        kube.close()
    (tmp_path / "insecure").mkdir()
    kube = client_for(kubeconfig(tmp_path / "insecure", srv.port, pki, insecure=True))
    try:
        assert kube.get_node("n1")["metadata"]["name"] == "n1"
    finally:
        kube.close()
    assert b"authorization: bearer t0ken\r\n" in srv.requests[-1].lower()


def test_a_tls_handshake_that_never_comes_is_a_connect_timeout(serve, pki, tmp_path) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (kernel backlog), never speaks TLS
    try:
        kube = KubeClient.from_kubeconfig(kubeconfig(tmp_path, silent.getsockname()[1], pki), timeout_s=0.5,
                                          retry=RetryPolicy(attempts=1))
        try:
            with pytest.raises(KubeTimeoutError) as ei:
                kube.get_node("n1")
            assert ei.value.reason == "connect timeout"
        finally:
            kube.close()
    finally:
        silent.close()


def test_a_proxy_keeps_the_urllib3_path(pki, tmp_path) -> None:
    kube = client_for(kubeconfig(tmp_path, 1, pki))
    try:
        assert kube._http1_pool() is not None
    finally:
        kube.close()
    path = kubeconfig(tmp_path, 1, pki)
    config = json.loads(Path(path).read_text())
    config["clusters"][0]["cluster"]["proxy-url"] = "http://proxy.invalid:3128"
    Path(path).write_text(json.dumps(config))
    kube = client_for(path)
    try:
        assert kube._api.configuration.proxy == "http://proxy.invalid:3128"
        assert kube._http1_pool() is None
        with pytest.raises(KubeError, match="proxy"):  # through urllib3's proxy manager, which fails here
            kube.get_node("n1")
    finally:
        kube.close()


def test_new_client_certificate_files_get_a_new_pool(pki, tmp_path) -> None:
    """An exec credential plugin's refresh may point the configuration at new certificate files."""
    kube = client_for(kubeconfig(tmp_path, 1, pki, client=pki.scheduler_client))
    try:
        first = kube._http1_pool()
        assert kube._http1_pool() is first
        cfg = kube._api.configuration
        cfg.cert_file, cfg.key_file = pki.other_client.cert, pki.other_client.key
        assert kube._http1_pool() is not first
        assert kube.with_options(timeout_s=1.0)._http1_pool() is kube._http1_pool()  # views share it
    finally:
        kube.close()


# -- watches (Pool.stream through KubeClient.watch)

def watch_script(events: list[dict], hold: threading.Event, *, status: str = "200 OK"):
    def script(conn, head, n):
        if status != "200 OK":
            conn.sendall(json_answer({"kind": "Status", "code": 403, "reason": "Forbidden",
                                      "message": "nodes is forbidden"}, status=status))
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for ev in events:
            line = json.dumps(ev).encode() + b"\n"
            half = len(line) // 2  # an event split over two chunks, as a real stream may deliver it
            conn.sendall(b"%x\r\n%s\r\n%x\r\n%s\r\n" % (half, line[:half], len(line) - half, line[half:]))
        hold.wait(30)  # then silence, as a watch with nothing to say
        return False
    return script


def plain_client(port: int) -> KubeClient:
    """A client of a plain-HTTP server, without a kubeconfig."""
    from kubernetes import client as kclient

    cfg = kclient.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    return KubeClient(kclient.ApiClient(cfg))


def read_then_close(stream, names: list[str]) -> None:
    """Read ``stream`` in another thread until it has delivered ``names``, check that the reader is then
    blocked on the silent stream, and that ``close()`` ends that blocked read within 2 s."""
    seen: list[str] = []
    ended = threading.Event()

    def read() -> None:
        for _type, obj in stream:
            seen.append(obj["metadata"]["name"])
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 5
    while len(seen) < len(names) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == names
    assert not ended.is_set()  # blocked on the silent stream
    t0 = time.monotonic()
    stream.close()
    assert ended.wait(2), "close() did not end the blocked read"
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("tls", [False, True])
def test_a_watch_streams_events_and_close_from_another_thread_ends_a_blocked_read(serve, pki, tmp_path,
                                                                                  tls: bool) -> None:
    hold = threading.Event()
    events = [{"type": "ADDED", "object": {"kind": "Node", "pad": "x" * 3000,
                                            "metadata": {"name": f"n{i}", "resourceVersion": str(i)}}}
              for i in range(3)]
    srv = serve(watch_script(events, hold), tls=server_tls(pki, require_client=False) if tls else None)
    kube = client_for(kubeconfig(tmp_path, srv.port, pki)) if tls else plain_client(srv.port)
    try:
        read_then_close(kube.watch("nodes", "0", timeout_s=60), ["n0", "n1", "n2"])
        sent = srv.requests[0].decode()
        assert sent.startswith("GET /api/v1/nodes?watch=1&resourceVersion=0&timeoutSeconds=60&"
                               "allowWatchBookmarks=true HTTP/1.1\r\n")
    finally:
        hold.set()
        kube.close()


def test_a_refused_watch_is_the_api_error(serve) -> None:
    srv = serve(watch_script([], threading.Event(), status="403 Forbidden"))
    kube = plain_client(srv.port)
    try:
        with pytest.raises(KubeError, match="nodes is forbidden") as ei:
            kube.watch("nodes", "0", timeout_s=60)
        assert ei.value.status == 403
    finally:
        kube.close()


def test_a_watch_through_the_urllib3_pool_of_a_proxied_configuration(serve, monkeypatch) -> None:
    """Where http1 cannot go (a proxy), watches take the kubernetes client's urllib3 pool: same events,
    same close from another thread."""
    hold = threading.Event()
    events = [{"type": "ADDED", "object": {"kind": "Node", "metadata": {"name": f"n{i}"}}} for i in range(2)]
    srv = serve(watch_script(events, hold))
    kube = plain_client(srv.port)
    monkeypatch.setattr(kube, "_http1_pool", lambda: None)
    try:
        read_then_close(kube.watch("nodes", "0", timeout_s=60), ["n0", "n1"])
    finally:
        hold.set()
        kube.close()
