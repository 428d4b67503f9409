"""Run every step, then write the report."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from sandbox.cluster import Sandbox, SandboxError
from sandbox.config import PREEMPTION_ON
from sandbox.demo import step_a, step_b, step_c, step_d, step_e, step_f, step_g
from sandbox.demo.core import Demo
from sandbox.report import STEP_TITLES, write_html, write_json
from sandbox.report_metrics import panels_html


def run_demo(sb: Sandbox, out: Path, keep: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        if f.is_file():
            f.unlink()
    demo = Demo(sb, out)
    print(
        "hami.node demo: a SIMULATED GPU cluster on this machine (gpusim GPUs, simulated Kubernetes API, "
        "kube-scheduler and kubelets; real agent, playbooks, podman nodes)",
        flush=True,
    )
    interrupted = False
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        try:
            step_a.run(demo)
        except SandboxError as exc:
            demo.check("sandbox started", False, str(exc))
            raise
        # step g only with HAMI_SANDBOX_PREEMPTION=1 (sandbox/config.py: not yet run in a full demo)
        for step in (step_b, step_c, step_d, step_e, step_f, *((step_g,) if PREEMPTION_ON else ())):
            demo.guarded(lambda s=step: s.run(demo))
    except KeyboardInterrupt:
        interrupted = True
        demo.check("demo ran to the end", False, "interrupted")
    except SandboxError:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        demo.header("h", "report")
        elapsed = time.monotonic() - demo.t0
        passed = sum(c.ok for c in demo.checks)
        for c in demo.checks:
            if not c.ok:
                demo.say(f"  FAIL ({c.step}) {c.name}: {c.detail}")
        demo.say(f"  {passed}/{len(demo.checks)} checks passed in {elapsed:.0f}s")
        text = "\n".join(
            f"[{'PASS' if c.ok else 'FAIL'}] {c.step}) {c.name}" + (f" -- {c.detail}" if c.detail else "")
            for c in demo.checks
        )
        (out / "report.txt").write_text(
            text + f"\n{passed}/{len(demo.checks)} checks passed in {elapsed:.0f}s\n"
        )
        write_html(out / "report.html", demo.checks, demo.sections, elapsed, panels_html(demo.scrapes()))
        write_json(out / "report.json", demo.checks, STEP_TITLES, demo.rollout, demo.fleet)
        demo.say(f"  report: {out / 'report.txt'}, {out / 'report.html'}, {out / 'report.json'}; "
                 f"logs: {sb.cfg.logs}")
        if not keep or interrupted:
            print("[sandbox] tearing down (use --keep to leave it running)", flush=True)
            sb.down()
    ok = bool(demo.checks) and all(c.ok for c in demo.checks)
    return 0 if ok else 1
