"""``free_port()``: a loopback TCP port for a process a test or benchmark starts and must tell its port.

A port below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768+ by default): a port
that bind(0) hands out comes from that range, and any outgoing connection on the machine may take it
between this check and the process's own bind (the process then fails to start).
"""

from __future__ import annotations

import random
import socket

_RNG = random.Random()
LOW, HIGH = 20000, 32000


def free_port() -> int:
    for _ in range(200):
        port = _RNG.randrange(LOW, HIGH)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH} after 200 tries")
