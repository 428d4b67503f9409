"""The demo's sick node: its dpkg lock is held, as by an unattended upgrade that never finishes, so site.yml's
convergence fails on it (apt waits out its lock timeout, then gives up) while the other nodes converge. The
run's per-node account names the node, the play and the task; once the lock is gone, a rerun of only the
nodes that need attention (``--limit @_needs-attention.txt``) finishes it (docs/rollouts.md, section 0).
"""

from __future__ import annotations

import json
from pathlib import Path

from sandbox import podman

SICK_NODE = "gpu-a100-3"
PIDFILE = "/run/hami-demo-dpkg-lock.pid"
# dpkg and apt take fcntl (POSIX record) locks on these files; flock(1) would not stop them
LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")
HOLD = (
    "import fcntl, os, time\n"
    f"held = [open(p, 'a') for p in {list(LOCKS)!r}]\n"
    "for f in held:\n"
    "    fcntl.lockf(f, fcntl.LOCK_EX)\n"
    f"open({PIDFILE!r}, 'w').write(str(os.getpid()))\n"
    "time.sleep(1800)\n"  # bounded: released by the demo long before
)
PROBE = (
    "import fcntl, sys\n"
    f"f = open({LOCKS[0]!r}, 'a')\n"
    "try:\n"
    "    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "except OSError:\n"
    "    sys.exit(0)\n"  # held by someone else
    "sys.exit(1)\n"
)


def hold_dpkg_lock(node: str = SICK_NODE, timeout_s: float = 15.0) -> bool:
    """Hold the node's dpkg locks in a background process; True once another process sees them held."""
    podman._podman("exec", "-d", node, "python3", "-c", HOLD, timeout_s=30)
    return podman.wait(lambda: podman.exec_(node, ["python3", "-c", PROBE], timeout_s=10, check=False)
                       .returncode == 0, timeout_s)


def release_dpkg_lock(node: str = SICK_NODE) -> None:
    podman.exec_(node, ["sh", "-c", f"kill $(cat {PIDFILE}) 2>/dev/null; rm -f {PIDFILE}"], timeout_s=15,
                 check=False)


def account(report_dir: Path) -> dict:
    """The run's per-node account (hami.node.fleet_account), or {} when none was written."""
    try:
        return json.loads((report_dir / "_account.json").read_text())
    except (OSError, ValueError):
        return {}
