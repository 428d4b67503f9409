"""A throw-away PKI for TLS tests, made with the ``openssl`` command (present wherever the agent's TLS
is: it comes with the ssl module's library's distribution packages): a CA, a server certificate for
127.0.0.1/localhost, client certificates, and a second, unrelated CA."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(d: Path, name: str) -> str:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=d)
    return str(d / f"{name}.key")


def make_ca(d: Path, name: str) -> Pair:
    key = _key(d, name)
    _run("req", "-x509", "-new", "-key", key, "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    return Pair(str(d / f"{name}.crt"), key)


def issue(d: Path, ca: Pair, name: str, cn: str, server: bool) -> Pair:
    key = _key(d, name)
    _run("req", "-new", "-key", key, "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" if server
                   else "extendedKeyUsage=clientAuth\n")
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
         "-out", f"{name}.crt", "-days", "2", "-extfile", str(ext), cwd=d)
    return Pair(str(d / f"{name}.crt"), key)


@dataclass(frozen=True)
class Pki:
    ca: Pair
    server: Pair
    scheduler_client: Pair  # CN kube-scheduler, signed by ca
    other_client: Pair  # CN intruder, signed by ca
    rogue_ca: Pair
    rogue_client: Pair  # CN kube-scheduler, signed by rogue_ca


def make_pki(d: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    ca = make_ca(d, "ca")
    rogue = make_ca(d, "rogue-ca")
    return Pki(ca=ca, server=issue(d, ca, "server", "hami-scheduler", server=True),
               scheduler_client=issue(d, ca, "client", "kube-scheduler", server=False),
               other_client=issue(d, ca, "intruder", "intruder", server=False),
               rogue_ca=rogue, rogue_client=issue(d, rogue, "rogue-client", "kube-scheduler", server=False))
