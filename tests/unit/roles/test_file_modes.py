"""Every kubeconfig, token, private key and certificate the roles write has a tight mode and, on the nodes,
root as owner (issue 14, deliverable 8).

The role tasks are read as data (no playbook runs): each task of a file-writing module is classified by
its destination (and, for looped tasks, by each loop item, with ``{{ item.x }}`` resolved). Secrets
(kubeconfigs, tokens, private keys, CSRs) must be 0600 or 0400; certificates 0644, 0640, 0600 or 0444;
directories holding them 0700 or 0750. A writer task for such a file without an explicit mode fails too
(the umask would decide). Tasks on the managed nodes must also set ``owner: root``; tasks delegated to the
controller write as the controller's user."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"

# module -> the argument naming the file it writes
WRITERS = {
    "ansible.builtin.copy": "dest",
    "ansible.builtin.template": "dest",
    "ansible.builtin.get_url": "dest",
    "ansible.builtin.file": "path",
    "community.crypto.openssl_privatekey": "path",
    "community.crypto.openssl_csr": "path",
    "community.crypto.x509_certificate": "path",
    "community.crypto.openssl_privatekey_pipe": "path",
}
SECRET = re.compile(r"kubeconfig|token|\.key$|\.key[\"'}]|private|credential|\.csr$", re.IGNORECASE)
CERT = re.compile(r"\.crt$|\.pem$|cert", re.IGNORECASE)
SECRET_DIR = re.compile(r"pki|secret|token", re.IGNORECASE)
SECRET_MODES = {"0600", "0400"}
CERT_MODES = {"0644", "0640", "0600", "0444"}
DIR_MODES = {"0700", "0750"}


@dataclass(frozen=True)
class Write:
    where: str  # role/tasks/file.yml: task name
    module: str
    dest: str
    mode: str | None
    owner: str | None
    on_controller: bool
    directory: bool


def _tasks(items: Any) -> Iterator[dict]:
    for t in items or []:
        if not isinstance(t, dict):
            continue
        yield t
        for key in ("block", "rescue", "always"):
            yield from _tasks(t.get(key))


def _resolve(text: Any, item: dict) -> str:
    return re.sub(r"\{\{\s*item\.(\w+)\s*\}\}", lambda m: str(item.get(m.group(1), m.group(0))), str(text))


def writes_in(path: Path) -> Iterator[Write]:
    for task in _tasks(yaml.safe_load(path.read_text())):
        module = next((m for m in WRITERS if m in task), None)
        if module is None:
            continue
        args = task[module] or {}
        if module == "ansible.builtin.file" and args.get("state") not in ("directory", "touch"):
            continue
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        where = f"{shown}: {task.get('name', '?')}"
        items = task.get("loop") if isinstance(task.get("loop"), list) else [{}]
        for raw in items:
            item = raw if isinstance(raw, dict) else {}
            mode = args.get("mode")
            yield Write(where, module, _resolve(args.get(WRITERS[module], ""), item),
                        None if mode is None else _resolve(mode, item), args.get("owner"),
                        task.get("delegate_to") == "localhost", args.get("state") == "directory")


def all_writes() -> list[Write]:
    return [w for p in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(ROLES.glob("*/handlers/*.yml"))
            for w in writes_in(p)]


def problems(writes: list[Write]) -> list[str]:
    out = []
    for w in writes:
        if w.directory:
            if not SECRET_DIR.search(w.dest):
                continue
            kind, allowed = "secret directory", DIR_MODES
        elif SECRET.search(w.dest) or w.module.endswith(("privatekey", "openssl_csr")):
            kind, allowed = "secret", SECRET_MODES
        elif CERT.search(w.dest) or w.module.endswith("x509_certificate"):
            kind, allowed = "certificate", CERT_MODES
        else:
            continue
        if w.mode is None:
            out.append(f"{w.where}: {kind} {w.dest} has no explicit mode (use one of {sorted(allowed)})")
        elif w.mode not in allowed:
            out.append(f"{w.where}: {kind} {w.dest} has mode {w.mode} (use one of {sorted(allowed)})")
        if not w.on_controller and w.owner != "root":
            out.append(f"{w.where}: {kind} {w.dest} on the node must be owned by root (owner: {w.owner})")
    return out


def test_every_secret_and_certificate_the_roles_write_has_a_tight_mode_and_owner():
    writes = all_writes()
    dests = " ".join(w.dest for w in writes)
    # the scan sees the files this test exists for (it cannot pass by finding nothing)
    for expected in ("hami_agent_kubeconfig_path", "hami_scheduler_kubeconfig_path", "scheduler.key",
                     "scheduler.crt", "ca.key", "hami-rbac-cluster.yaml"):
        assert expected in dests, f"{expected} not found among the roles' file writes"
    assert not problems(writes), "\n".join(problems(writes))


def test_the_check_catches_loose_modes_missing_modes_and_owners(tmp_path: Path):
    bad = tmp_path / "tasks.yml"
    bad.write_text(yaml.safe_dump([
        {"name": "kubeconfig world-readable", "ansible.builtin.copy": {
            "dest": "/etc/hami/kubeconfig", "mode": "0644", "owner": "root"}},
        {"name": "key without mode", "community.crypto.openssl_privatekey": {"path": "/etc/x/tls.key"},
         "delegate_to": "localhost"},
        {"name": "looped", "ansible.builtin.copy": {"dest": "/etc/p/{{ item.dest }}",
                                                    "mode": "{{ item.mode }}", "owner": "root"},
         "loop": [{"dest": "ca.crt", "mode": "0666"}, {"dest": "node.key", "mode": "0600"}]},
        {"name": "token not root", "ansible.builtin.template": {"dest": "/etc/hami/token", "mode": "0600"}},
        {"name": "block", "block": [{"name": "pki dir", "ansible.builtin.file": {
            "path": "/etc/hami/pki", "state": "directory", "mode": "0755", "owner": "root"}}]},
    ]))
    found = problems(list(writes_in(bad)))
    assert len(found) == 5, found
    assert any("kubeconfig" in p and "0644" in p for p in found)
    assert any("tls.key has no explicit mode" in p for p in found)
    assert any("ca.crt has mode 0666" in p for p in found)
    assert any("/etc/hami/token on the node must be owned by root" in p for p in found)
    assert any("secret directory /etc/hami/pki has mode 0755" in p for p in found)
