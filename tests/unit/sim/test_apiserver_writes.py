"""The simulated API server sends an answer as Go's ``net/http`` does (``GoConnWriter``: its 4 KiB
``bufio.Writer`` on the connection), so a client wakes as often as it would reading kube-apiserver: not
once per header line or chunk (kinder to nobody), not once for a whole 14 KB watch event (kinder)."""

from __future__ import annotations

import json
import socket

from tests.sim.apiserver import GO_CONN_BUFFER, ApiServer, GoConnWriter
from tests.sim.apiserver_auth import ADMIN_TOKEN


def _sends(*writes: bytes, flush: bool = True) -> list[bytes]:
    sent: list[bytes] = []
    out = GoConnWriter(sent.append)
    for w in writes:
        out.write(w)
    if flush:
        out.flush()
    return sent


def test_small_writes_leave_together_at_the_flush() -> None:
    assert _sends(b"HTTP/1.1 200 OK\r\n\r\n", b"{}") == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    assert _sends(b"abc", flush=False) == []
    assert _sends() == []  # a flush with nothing buffered sends nothing


def test_a_write_past_the_buffer_fills_it_sends_it_and_keeps_the_rest_for_the_flush() -> None:
    head, body = b"h" * 300, b"b" * 6000
    sent = _sends(head, body)
    assert [len(s) for s in sent] == [GO_CONN_BUFFER, 300 + 6000 - GO_CONN_BUFFER]
    assert b"".join(sent) == head + body


def test_a_large_write_into_an_empty_buffer_goes_straight_through() -> None:
    big = b"x" * 10_000
    assert _sends(big) == [big]
    # a watch event over 4 KiB: its chunk header is buffered first, so the data fills the buffer, then the
    # rest is larger than the buffer and goes straight through, then the closing CRLF at the flush
    sent = _sends(b"%x\r\n" % 14_000, b"e" * 14_000, b"\r\n")
    assert [len(s) for s in sent] == [GO_CONN_BUFFER, 14_000 + 6 - GO_CONN_BUFFER, 2]


def test_an_answer_sent_through_the_go_writer_is_whole_and_chunked() -> None:
    """A ~6 KB object read from the simulated server over a raw socket: headers, chunks and terminator
    written through ``GoConnWriter`` still make one well-framed answer."""
    with ApiServer() as api:
        api.create({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "big", "namespace": "default"}, "data": {"k": "v" * 6000}})
        with socket.create_connection(("127.0.0.1", api.port), timeout=5) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            s.sendall(b"GET /api/v1/namespaces/default/configmaps/big HTTP/1.1\r\nHost: x\r\n"
                      b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n\r\n")
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                piece = s.recv(1 << 20)
                assert piece, "the server closed the connection"
                data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    chunks, rest = [], body
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        chunks.append(rest[:n])
        rest = rest[n + 2:]
    assert json.loads(b"".join(chunks))["data"]["k"] == "v" * 6000


def test_a_watch_event_is_encoded_once_per_type_for_every_watcher() -> None:
    """kube-apiserver's watch cache serializes an event once (``cachingObject``); so does the simulator."""
    from tests.sim.apiserver_store import HistoryEntry

    node = {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7"}}
    e = HistoryEntry(7, "nodes", "MODIFIED", None, node)
    first = e.event_line("MODIFIED")
    assert e.event_line("MODIFIED") is first  # the second watcher gets the same bytes, not a new encoding
    assert json.loads(first) == {"type": "MODIFIED", "object": node} and first.endswith(b"\n")
    added = e.event_line("ADDED")  # a watcher whose selector the object just entered
    assert json.loads(added)["type"] == "ADDED" and added is not first
