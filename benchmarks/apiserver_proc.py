"""The SIMULATED API server in a process of its own, for benchmarks: a real control plane runs
kube-apiserver apart from kube-scheduler, the extender and the kubelets, and one Python process running
all of them would charge the API server's work to whichever component happens to wait for the GIL.

``python -m benchmarks.apiserver_proc --dir DIR`` writes ``DIR/kubeconfig`` once serving; on SIGUSR1 it
writes ``DIR/accounting.json`` (requests per user agent, user and verb: ``apiserver_lists``); SIGTERM
stops it. ``ApiServerProcess`` wraps that for a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.apiserver_proc")
    p.add_argument("--dir", required=True)
    p.add_argument("--history", type=int, default=200_000)
    p.add_argument("--bookmark-interval", type=float, default=5.0)
    p.add_argument("--port", type=int, default=0, help="listen on 127.0.0.1:PORT (default: any free port)")
    p.add_argument("--graceful-deletion", type=int, default=0,
                   help="1: a deleted bound pod terminates until its kubelet confirms (apiserver_policy.py)")
    args = p.parse_args(argv)
    from tests.sim.apiserver import ApiServer

    out = Path(args.dir)
    api = ApiServer(port=args.port, history_limit=args.history,
                    bookmark_interval_s=args.bookmark_interval).start()
    api.policy.graceful_deletion = bool(args.graceful_deletion)
    stop = threading.Event()
    dump = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: dump.set())
    (out / "pid").write_text(f"{os.getpid()}\n")
    tmp = out / "kubeconfig.tmp"
    tmp.write_text(Path(api.kubeconfig_path).read_text())
    os.replace(tmp, out / "kubeconfig")
    while not stop.wait(0.05):
        if dump.is_set():
            dump.clear()
            rows = [{"agent": ua, "user": user, "verb": verb, "requests": t.requests, "bytes_in": t.bytes_in,
                     "bytes_out": t.bytes_out}
                    for (ua, user, verb), t in api.accounting.snapshot().items()]
            tmp = out / "accounting.json.tmp"
            tmp.write_text(json.dumps({"since": api.accounting.since, "rows": rows,
                                       "objects": api.store.current_rv()}))
            os.replace(tmp, out / "accounting.json")
            if (out / "reset").exists():
                (out / "reset").unlink()
                api.accounting.reset()
    api.close()
    return 0


def read_accounting(workdir: str | Path, reset: bool = False, pid: int | None = None,
                    timeout_s: float = 10.0) -> dict:
    """Ask the server process of ``workdir`` (its pid: ``pid``, else ``workdir/pid``) for its accounting:
    requests since the last reset. Usable from another process (the fleet benchmark's callback plugin)."""
    wd = Path(workdir)
    target = wd / "accounting.json"
    before = target.stat().st_mtime_ns if target.exists() else 0
    if reset:
        (wd / "reset").touch()
    os.kill(pid if pid is not None else int((wd / "pid").read_text()), signal.SIGUSR1)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if target.exists() and target.stat().st_mtime_ns != before and not (wd / "reset").exists():
            return json.loads(target.read_text())
        time.sleep(0.02)
    raise RuntimeError("API server process did not answer the accounting request")


class ApiServerProcess:
    """Start the server process, wait for its kubeconfig; ``accounting(reset=)``; ``stop()``."""

    def __init__(self, workdir: str, **kw: Any) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "benchmarks.apiserver_proc", "--dir", str(self.dir)]
        for k, v in kw.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir / "apiserver.log", "w"))  # noqa: SIM115
        end = time.monotonic() + 30
        while not (self.dir / "kubeconfig").exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                log = (self.dir / "apiserver.log").read_text()
                raise RuntimeError(f"API server process did not start: {log}")
            time.sleep(0.05)
        self.kubeconfig_path = str(self.dir / "kubeconfig")

    def accounting(self, reset: bool = False) -> dict:
        """Requests since the last reset (``reset=True`` starts a new window after reading)."""
        return read_accounting(self.dir, reset=reset, pid=self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


if __name__ == "__main__":
    sys.exit(main())
