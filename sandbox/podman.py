"""The node containers: podman with systemd as PID 1 on the host network (docs/sandbox.md)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from sandbox.config import CONTAINER_LABEL

# the machine forbids raising hard limits (testing-notes.md): podman must not try
ULIMITS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=1000:1000")


class PodmanError(RuntimeError):
    pass


def _podman(*args: str, timeout_s: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            ["podman", *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        raise PodmanError("podman is not installed: run scripts/install-system-deps.sh") from None
    except subprocess.TimeoutExpired:
        raise PodmanError(f"podman {' '.join(args[:2])} did not finish within {timeout_s:.0f}s") from None
    if check and proc.returncode != 0:
        raise PodmanError(
            f"podman {' '.join(args[:3])} failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        )
    return proc


def exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


def running(name: str) -> bool:
    proc = _podman("inspect", "--format", "{{.State.Running}}", name, check=False)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def cli(*args: str, timeout_s: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """``podman ARGS`` with a deadline; PodmanError on a timeout or (``check``) a non-zero exit."""
    return _podman(*args, timeout_s=timeout_s, check=check)


def run_node(
    name: str,
    image: str,
    volumes: Sequence[tuple[Path | str, str, str]],
    *,
    label: str = CONTAINER_LABEL,
    ulimits: Sequence[str] = ULIMITS,
    extra: Sequence[str] = (),
    create_only: bool = False,
) -> None:
    """Start container ``name`` (hostname = name) with systemd, host network and the bind mounts
    ``(host, container, opts)``. ``label``/``ulimits``/``extra`` (more ``podman run`` options) serve other
    users of the same node shape (benchmarks/fleet); ``create_only`` creates it without starting it."""
    args = [
        "create" if create_only else "run",
        *([] if create_only else ["-d"]),
        "--name",
        name,
        "--hostname",
        name,
        "--label",
        label,
        "--systemd=always",
        "--network",
        "host",
        *ulimits,
        *extra,
    ]
    for host, ctr, opts in volumes:
        args += ["-v", f"{host}:{ctr}" + (f":{opts}" if opts else "")]
    args += [image, "/sbin/init"]
    _podman(*args, timeout_s=120)


def wait_booted(name: str, timeout_s: float = 60.0) -> str:
    """Wait for systemd in the container; returns its state (running/degraded)."""
    proc = exec_(
        name,
        ["timeout", str(int(timeout_s)), "systemctl", "is-system-running", "--wait"],
        timeout_s=timeout_s + 10,
        check=False,
    )
    state = proc.stdout.strip()
    if state not in ("running", "degraded"):
        raise PodmanError(f"container {name}: systemd did not boot within {timeout_s:.0f}s (state {state!r})")
    return state


def exec_(
    name: str,
    argv: Sequence[str],
    timeout_s: float = 60.0,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    extra: list[str] = []
    for k, v in (env or {}).items():
        extra += ["--env", f"{k}={v}"]
    return _podman("exec", *extra, name, *argv, timeout_s=timeout_s, check=check)


def unit_active(name: str, unit: str) -> bool:
    proc = exec_(name, ["systemctl", "is-active", unit], timeout_s=15, check=False)
    return proc.stdout.strip() == "active"


def unit_enabled(name: str, unit: str) -> bool:
    """The unit is installed and enabled (it may be (re)starting)."""
    proc = exec_(name, ["systemctl", "is-enabled", unit], timeout_s=15, check=False)
    return proc.stdout.strip() == "enabled"


def remove(name: str) -> bool:
    if not exists(name):
        return False
    _podman("rm", "-f", "-t", "5", name, timeout_s=60, check=False)
    return True


def sandbox_containers(label: str = CONTAINER_LABEL) -> list[str]:
    proc = _podman("ps", "-a", "--filter", f"label={label}", "--format", "json", check=False)
    try:
        return sorted(n for c in json.loads(proc.stdout or "[]") for n in c.get("Names", []))
    except ValueError:
        return []


def wait(predicate, timeout_s: float, interval_s: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
