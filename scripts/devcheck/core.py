"""Records, the global deadline, the processes the check starts, and the report it writes.

Every wait has a timeout: subprocesses run in their own session and are killed (SIGTERM, then SIGKILL of the
whole process group) when their time is up, and at the end whatever the check started is stopped, also
after an error or a SIGTERM. Nothing here touches the GPU's settings.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASS = "pass"
FAIL = "fail"
NOT_SUPPORTED = "not-supported-here"
SKIPPED = "skipped"
STATUSES = (PASS, FAIL, NOT_SUPPORTED, SKIPPED)

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agent"
GPUSIM_BIN = REPO / "tests" / "gpusim" / "bin"
EVIDENCE_FILE_CAP = 4 << 20  # bytes of one evidence file kept in the tarball (its tail)


class CheckError(Exception):
    """A check's failure with the one line that says why (becomes the record's evidence)."""


@dataclass
class Result:
    status: str
    evidence: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Record:
    name: str
    title: str
    status: str
    evidence: str
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "evidence": self.evidence,
                "duration_s": round(self.duration_s, 3), "details": self.details}


@dataclass
class Check:
    name: str
    title: str
    budget_s: float
    run: Callable[[Ctx], Result]


class Procs:
    """Every long-running process the check starts; ``stop_all`` ends them (by pid/process group)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path | None,
              cwd: Path | None = None, stdin: Any = subprocess.DEVNULL,
              stdout: Any = None) -> subprocess.Popen:
        out: Any = stdout
        fh = None
        if out is None and log is not None:
            fh = open(log, "ab")  # noqa: SIM115 - handed to the child, closed right after the fork
            out = fh
        try:
            proc = subprocess.Popen(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT if fh else None,
                                    stdin=stdin, cwd=str(cwd) if cwd else None, start_new_session=True)
        finally:
            if fh is not None:
                fh.close()
        self.procs.append((name, proc))
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; never waits longer than that + 2 s."""
        if proc.poll() is None:
            _signal_group(proc.pid, sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)  # children of a process that exited (workers, loaders)
        if proc.poll() is None:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
        return proc.poll()

    def stop_all(self) -> list[str]:
        """Stop everything still running, newest first; returns what had to be killed."""
        notes = []
        for name, proc in reversed(self.procs):
            alive = proc.poll() is None
            rc = self.stop(proc, grace_s=3.0)
            if alive:
                notes.append(f"{name} (pid {proc.pid}) stopped at the end, exit {rc}")
        return notes


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the process was started in its own session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Ran:
    rc: int | None  # None: killed at its timeout
    out: str
    err: str
    seconds: float
    timed_out: bool = False


class Ctx:
    """What every check shares: mode, paths, environment, the deadline, the started processes, facts."""

    def __init__(self, args: Any, work: Path, dry_run: bool, nvml_lib: str | None, deadline: float) -> None:
        self.args = args
        self.work = work
        self.evidence = work / "evidence"
        self.evidence.mkdir(parents=True, exist_ok=True)
        self.dry_run = dry_run
        self.nvml_lib = nvml_lib
        self.deadline = deadline
        self.procs = Procs()
        self.facts: dict[str, Any] = {}
        self.cleanups: list[Callable[[], None]] = []
        self.env = self._agent_env()

    def _agent_env(self) -> dict[str, str]:
        env = dict(os.environ)
        parts = [str(AGENT), str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env["PYTHONUNBUFFERED"] = "1"
        if self.nvml_lib:
            env["HAMI_NVML_LIBRARY"] = self.nvml_lib
        if self.dry_run:
            env["PATH"] = f"{GPUSIM_BIN}{os.pathsep}{env.get('PATH', '')}"
        return env

    # ------------------------------------------------------------------------------------ time
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def budget(self, want: float) -> float:
        """``want`` seconds, or what is left of the global deadline (at least 0.1 s)."""
        return max(0.1, min(want, self.left()))

    # ------------------------------------------------------------------------------------ commands
    def agent_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "hami_agent", *args]

    def run(self, argv: Sequence[str], timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None, input_text: str | None = None) -> Ran:
        """Run to completion within ``timeout`` (clipped to the global deadline); on timeout the whole
        process group is killed and ``rc`` is None."""
        t0 = time.monotonic()
        timeout = self.budget(timeout)
        try:
            proc = subprocess.Popen(list(argv), env=env or self.env, cwd=str(cwd) if cwd else None,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                                    start_new_session=True, text=True)
        except OSError as exc:
            return Ran(127, "", f"{argv[0]}: {exc}", time.monotonic() - t0)
        try:
            out, err = proc.communicate(input_text, timeout=timeout)
            return Ran(proc.returncode, out, err, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=3.0)
            except subprocess.TimeoutExpired:
                out, err = "", ""
            return Ran(None, out or "", err or "", time.monotonic() - t0, timed_out=True)

    def save(self, name: str, content: str | bytes | Any) -> Path:
        """Write evidence (text, bytes or JSON-able) under the evidence folder."""
        path = self.evidence / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(json.dumps(content, indent=2, default=str))
        return path

    def log_path(self, name: str) -> Path:
        return self.evidence / "logs" / name

    def cleanup(self) -> list[str]:
        notes = []
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - cleanup goes on
                notes.append(f"cleanup {getattr(fn, '__name__', fn)}: {exc}")
        notes += self.procs.stop_all()
        return notes


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``pred`` until truthy or ``timeout``; exceptions count as 'not yet'. Returns the last value."""
    end = time.monotonic() + max(0.0, timeout)
    value = None
    while True:
        try:
            value = pred()
        except Exception:  # noqa: BLE001
            value = None
        if value or time.monotonic() >= end:
            return value
        time.sleep(interval)


def run_checks(ctx: Ctx, checks: Sequence[Check], log: Callable[[str], None]) -> list[Record]:
    records = []
    for check in checks:
        if ctx.left() < 1.0:
            records.append(Record(check.name, check.title, SKIPPED,
                                  "not reached: the global deadline (--deadline) had passed", 0.0,
                                  {"not_reached": True}))
            log(f"[{check.name}] skipped: not reached before the global deadline")
            continue
        log(f"[{check.name}] {check.title} ...")
        t0 = time.monotonic()
        try:
            res = check.run(ctx)
        except CheckError as exc:
            res = Result(FAIL, str(exc))
        except Exception as exc:  # noqa: BLE001 - a broken check is a failed check, the others go on
            res = Result(FAIL, f"{type(exc).__name__}: {exc}",
                         {"traceback": traceback.format_exc(limit=8)})
        took = time.monotonic() - t0
        if res.status not in STATUSES:
            res = Result(FAIL, f"check returned an unknown status {res.status!r}: {res.evidence}",
                         res.details)
        if took > check.budget_s * 1.5 + 5 and res.status == PASS:
            res.details["over_budget"] = f"took {took:.1f}s, budget {check.budget_s:.0f}s"
        records.append(Record(check.name, check.title, res.status, res.evidence, took, res.details))
        log(f"[{check.name}] {res.status} ({took:.1f}s): {res.evidence}")
    return records


# ---------------------------------------------------------------------------------------- report
def summary(records: Sequence[Record]) -> dict[str, int]:
    out = dict.fromkeys(STATUSES, 0)
    for r in records:
        out[r.status] += 1
    return out


def markdown(meta: dict[str, Any], records: Sequence[Record]) -> str:
    lines = [f"# hami-agent device check ({meta['mode']})", ""]
    for key in ("started", "host", "device", "driver", "cuda", "python", "hami_core", "total_s", "exit_code"):
        if meta.get(key) not in (None, ""):
            lines.append(f"- {key}: {meta[key]}")
    lines += ["", "| check | status | evidence | seconds |", "|---|---|---|---|"]
    for r in records:
        ev = r.evidence.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.name} | **{r.status}** | {ev} | {r.duration_s:.1f} |")
    counts = summary(records)
    lines += ["", "totals: " + ", ".join(f"{k} {v}" for k, v in counts.items()), ""]
    if meta.get("not_reached"):
        lines.append("not reached before the deadline: " + ", ".join(meta["not_reached"]))
    if meta.get("cleanup"):
        lines += ["", "cleanup:"] + [f"- {n}" for n in meta["cleanup"]]
    return "\n".join(lines) + "\n"


def write_report(out: Path, meta: dict[str, Any], records: Sequence[Record], evidence: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": summary(records), "checks": [r.as_dict() for r in records]}
    js = out / "device-check.json"
    js.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    md = out / "device-check.md"
    md.write_text(markdown(meta, records))
    tar = out / "evidence.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for path in sorted(evidence.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            if len(data) > EVIDENCE_FILE_CAP:
                data = b"[... head cut: kept the last %d bytes ...]\n" % EVIDENCE_FILE_CAP + \
                    data[-EVIDENCE_FILE_CAP:]
            info = tarfile.TarInfo(f"evidence/{path.relative_to(evidence)}")
            info.size = len(data)
            info.mtime = int(path.stat().st_mtime)
            tf.addfile(info, io.BytesIO(data))
    return [js, md, tar]
