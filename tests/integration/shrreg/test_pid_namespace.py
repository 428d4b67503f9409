"""Container PID namespaces: slot PIDs and owner_pid are container PIDs, not host PIDs.

A process started with ``unshare --pid --fork`` is PID 1 in its own namespace, like a container's
entrypoint. Its slot and lock record PID 1; on the host PID 1 is init and always alive, so a naive
``kill -0 <pid>`` check would call a dead holder alive forever (or, the other way round, call a live
container process dead). The tool must map through the processes that have the region mapped.
"""

import shutil
import subprocess
import time

import pytest

from hami_agent.shrreg import cleanup, force_unlock, read_region, scan_attachment
from hami_agent.shrreg.liveness import State
from tests.shrreg.helpers import MKREGION, Mk, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    cp = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10, check=False)
    return cp.returncode == 0


needs_pidns = pytest.mark.skipif(not _unshare_works(), reason="unshare --pid not permitted here")


def _start_in_namespace(f, layout, *args, pid1=True):
    """mkregion live in a new PID namespace: as its PID 1, or (pid1=False) as PID 2 under a shell."""
    cmd = [str(MKREGION), "live", str(f), layout, *args]
    if not pid1:
        cmd = ["sh", "-c", '"$@"; exit $?', "sh", *cmd]  # sh stays PID 1, mkregion becomes PID 2
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read())
    return proc, int(line.split()[1])


@needs_pidns
def test_live_holder_in_container_namespace_is_alive(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    proc, inner = _start_in_namespace(f, "v1.2", "30", "hold")
    procs.append(proc)
    assert inner == 1, "unshare'd process should be PID 1 in its namespace"
    r = read_region(f)
    assert r.owner_pid == 1 and r.locked and r.procs[0].pid == 1
    att = scan_attachment(f)
    v = att.verdict(1)
    assert v.state is State.ALIVE and v.host_pids and v.host_pids[0] != 1
    before = f.read_bytes()
    res = force_unlock(str(f))
    assert not res.ok and "still running" in res.refused[0]
    assert f.read_bytes() == before
    assert mk.semval()["sem"] == "0"


def _wait_detached(f):
    deadline = time.monotonic() + 5
    while scan_attachment(f).processes and time.monotonic() < deadline:
        time.sleep(0.05)


@needs_pidns
def test_dead_container_pid_2_is_dead_although_host_pid_2_lives(mkregion, tmp_path, procs):
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    proc, inner = _start_in_namespace(f, "v1.2", "30", "hold", pid1=False)
    assert inner == 2
    stop(proc)  # SIGKILL the container while it holds the lock
    _wait_detached(f)
    r = read_region(f)
    assert r.owner_pid == 2 and r.locked
    assert scan_attachment(f).verdict(2).state is State.DEAD
    res = force_unlock(str(f))
    assert res.ok and res.applied, res
    assert mk.semval()["sem"] == "1"
    res = cleanup(str(f))
    assert res.ok and res.applied
    assert [s.pid for s in read_region(f).procs if s.pid] == []


@needs_pidns
def test_dead_container_pid_1(mkregion, tmp_path, procs):
    """Dead when every process is inspectable; refused (nothing written) when host PID 1 hides its maps."""
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    proc, _ = _start_in_namespace(f, "v1.2", "30", "hold")
    stop(proc)
    _wait_detached(f)
    try:
        open("/proc/1/maps").close()
        host_pid1_readable = True
    except PermissionError:
        host_pid1_readable = False
    before = f.read_bytes()
    res = force_unlock(str(f))
    if host_pid1_readable:
        assert res.ok and res.applied and mk.semval()["sem"] == "1"
    else:
        assert not res.ok and "cannot be verified dead" in res.refused[0] and "/proc/1/maps" in res.refused[0]
        assert f.read_bytes() == before


@needs_pidns
def test_pid_2_in_region_is_not_confused_with_host_pid_2(mkregion, tmp_path, procs):
    # host PID 2 (kthreadd) exists, but no process with container PID 2 has the region mapped
    f = tmp_path / "r.cache"
    mk = Mk(f, "v1.2").create()
    proc, _ = _start_in_namespace(f, "v1.2", "30")
    procs.append(proc)
    mk.slot(2, 0, 1, 1 << 20)
    att = scan_attachment(f)
    assert att.verdict(1).state is State.ALIVE
    assert att.verdict(2).state is State.DEAD
