"""``make demo`` / ``python -m hami_agent.demo``: seed 003's node, simulated, before and after the fix.

Everything here runs on gpusim (a SIMULATED GPU node: fake libnvidia-ml.so.1 + state file), no GPU:
  1. the seed's node (8x H20, GPUs 0-2 split into 4 MIG devices each) on the fixed driver 570.172.08:
     ``hami-agent devices`` lists 8 GPUs and 12 MIG devices;
  2. the same node on 570.158.01 (mixed MIG + full GPUs, the NVML init hang): ``hami-agent devices``
     still returns within its timeout, exit 1, naming ``nvmlInit`` -- where the NVIDIA plugin blocked
     the kubelet forever.
Exit 0 only if both checks pass. A later sandbox demo replaces this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPUSIM = REPO / "tests" / "gpusim"
LIB = GPUSIM / "build" / "libnvidia-ml.so.1"
SEED_DRIVER_BAD = "570.158.01"
SEED_DRIVER_FIXED = "570.172.08"
HANG_TIMEOUT_S = 5.0


def say(msg: str) -> None:
    print(msg, flush=True)


def build_gpusim() -> None:
    if not GPUSIM.is_dir():
        raise SystemExit("demo: tests/gpusim not found; run the demo from a source checkout")
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(GPUSIM)], capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0 or not LIB.exists():
        raise SystemExit(f"demo: building gpusim failed:\n{proc.stdout}{proc.stderr}")


def gpusim(state: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(GPUSIM / "bin" / "gpusim"), "--state", str(state), *args],
                   check=True, timeout=30, stdout=subprocess.DEVNULL)


def devices(state: Path, *args: str, timeout_s: float = 10.0) -> tuple[int, str, str, float]:
    env = dict(os.environ, GPUSIM_STATE=str(state))
    cmd = [sys.executable, "-m", "hami_agent", "devices", "--nvml-lib", str(LIB),
           "--timeout", str(timeout_s), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 30, check=False)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


def step_fixed_driver(state: Path) -> bool:
    say(f"\n== step 1: seed 003's node (8x NVIDIA H20, MIG on GPUs 0-2) on driver {SEED_DRIVER_FIXED} ==")
    gpusim(state, "driver", SEED_DRIVER_FIXED)
    rc, out, err, took = devices(state)
    say(out.rstrip() or err.rstrip())
    rc_json, out_json, _, _ = devices(state, "--json")
    try:
        doc = json.loads(out_json)
    except ValueError:
        say(f"FAIL: `hami-agent devices --json` printed no JSON (exit {rc_json})")
        return False
    gpus = doc.get("gpus", [])
    migs = sum(len(g.get("mig_devices", [])) for g in gpus)
    ok = rc == 0 and rc_json == 0 and len(gpus) == 8 and migs == 12
    say(f"{'PASS' if ok else 'FAIL'}: {len(gpus)} GPUs, {migs} MIG devices, exit {rc}, {took:.1f}s "
        "(expected 8 GPUs, 12 MIG devices, exit 0)")
    return ok


def step_bad_driver(state: Path) -> bool:
    say(f"\n== step 2: the same node on driver {SEED_DRIVER_BAD} (NVML init hang with mixed MIG) ==")
    gpusim(state, "driver", SEED_DRIVER_BAD)
    rc, _, err, took = devices(state, timeout_s=HANG_TIMEOUT_S)
    say(err.rstrip())
    ok = rc == 1 and "nvmlInit" in err and took < HANG_TIMEOUT_S + 10
    say(f"{'PASS' if ok else 'FAIL'}: exit {rc} after {took:.1f}s with --timeout {HANG_TIMEOUT_S:g} "
        "(expected exit 1 naming nvmlInit, no hang)")
    return ok


def main() -> int:
    say("hami.node demo -- on gpusim, a SIMULATED GPU node (no GPU needed)")
    build_gpusim()
    with tempfile.TemporaryDirectory(prefix="hami-demo-") as tmp:
        state = Path(tmp) / "state.json"
        gpusim(state, "init", "--profile", "h20-mig-mixed")
        results = {"devices on the fixed driver": step_fixed_driver(state),
                   "bounded NVML hang on the bad driver": step_bad_driver(state)}
    say("\n== summary ==")
    for name, ok in results.items():
        say(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
