"""``python -m sandbox up|down|status|demo`` (with the project's venv: ``.venv/bin/python -m sandbox``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from sandbox import config
from sandbox.cluster import Sandbox, SandboxError


def _say(msg: str) -> None:
    print(f"[sandbox] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox", description="the hami.node SIMULATED GPU cluster")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help=f"state, logs and pid files (default $HAMI_SANDBOX_DIR or {config.DEFAULT_RUN_DIR})",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="build what is missing and start the sandbox (idempotent)")
    up.add_argument("--no-build", action="store_true", help="skip the gpusim/image/apt-repo build checks")
    up.add_argument(
        "--provision",
        action="store_true",
        help="also run playbooks/site.yml (agents as systemd services in the nodes)",
    )
    sub.add_parser("down", help="stop every sandbox process and remove the containers (idempotent)")
    st = sub.add_parser("status", help="what is running")
    st.add_argument("--json", action="store_true")
    demo = sub.add_parser("demo", help="up + site.yml + sample workload + seed 003 replay + report")
    demo.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")
    demo.add_argument("--output", type=Path, default=config.REPO / "demo-output", help="report directory")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = config.load(args.run_dir)
    except config.ConfigError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 2
    sb = Sandbox(cfg, _say)
    if args.action == "demo":
        from sandbox.demo import run_demo

        return run_demo(sb, args.output, keep=args.keep)
    if args.action == "down":
        for item in sb.down():
            _say(f"stopped {item}")
        _say("sandbox is down")
        return 0
    if args.action == "status":
        st_ = sb.status()
        if args.json:
            print(json.dumps(st_, indent=2))
        else:
            for k, v in st_.items():
                print(f"{k:12} {v}")
        return 0
    # up: a failure or Ctrl-C half way tears everything down again (no half-started sandbox left)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        sb.up(build=not args.no_build, provision=args.provision)
    except (SandboxError, KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - always tear down
        print(
            f"sandbox: up failed: {exc!r}" if not isinstance(exc, SandboxError) else f"sandbox: {exc}",
            file=sys.stderr,
        )
        sb.down()
        return 1
    _say(f"sandbox is up: kubeconfig {cfg.kubeconfig}, logs {cfg.logs}; `python -m sandbox down` to stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
