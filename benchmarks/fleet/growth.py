"""Why one ansible-playbook process gets dearer per host-task as hosts are added (issue 26 item 3).

An experiment, not the product: the fleet benchmark measured the main process's work per host-task growing
from 9.5 ms at 25 hosts to 13.7 ms at 100, and the workers' from 39 to 65 ms. This isolates one suspect with
nothing but Ansible: the same 20 tasks (``debug``; one worker fork each, no module on a host) over N hosts
reached with ``ansible_connection=local``, once as they are and once after each host keeps a fact the size
of ``package_facts``' answer on a small Debian node (400 packages). Every worker is a fork of the main
process: the bigger its heap, the dearer the fork (page tables) and the child (copy-on-write faults as
Python touches the objects it inherited). Printed per size: the main process's work, the forks' cost and
the workers' CPU, each per host-task, and the main process's max RSS, from the fleet benchmark's own
callback (``callback_plugins/fleet_bench_account.py``).

Run: ``python -m benchmarks.fleet.growth [--sizes 25,200] [--tasks 20]`` (no podman; ~4 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEPT = {"both": (False, True), "yes": (True,), "no": (False,)}

# about what package_facts keeps per host on a small Debian node: one entry per package, each a list of
# one dict with these six fields
KEPT_FACT = (
    "{{ dict(range(400) | map('string') | zip(range(400) | map('extract', [[{'name': 'x', 'version': "
    "'1.2.3-4', 'arch': 'amd64', 'category': 'misc', 'origin': 'Debian', 'source': 'apt'}]] * 400))) }}"
)


def playbook(tasks: int, kept: bool) -> str:
    lines = ["- hosts: fleet", "  gather_facts: false", "  tasks:"]
    if kept:
        lines += [
            "    - name: keep a package_facts-sized fact",
            "      ansible.builtin.set_fact:",
            f'        kept: "{KEPT_FACT}"',
        ]
    for i in range(tasks):
        lines += [f"    - name: task {i}", "      ansible.builtin.debug: {msg: x}"]
    return "\n".join(lines) + "\n"


def run_once(work: Path, hosts: int, tasks: int, kept: bool, strategy: str = "",
             strategy_plugins: str = "") -> dict:
    inv = work / f"inv-{hosts}.ini"
    inv.write_text(
        "[fleet]\n"
        + "".join(
            f"h{i} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
            for i in range(hosts)
        )
    )
    pb = work / f"pb-{int(kept)}.yml"
    pb.write_text(playbook(tasks, kept))
    account = work / f"account-{hosts}-{int(kept)}.json"
    env = {
        **os.environ,
        "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "fleet_bench_account",
        "ANSIBLE_FORKS": "50",
        "ANSIBLE_CONFIG": str(work / "none.cfg"),  # not the repository's ansible.cfg: Ansible's defaults
        "HAMI_FLEETBENCH_ACCOUNT": str(account),
    }
    if strategy:  # e.g. linear_fleet from plugins/strategy (or a copy of an older one, for an A/B)
        env["ANSIBLE_STRATEGY"] = strategy
        env["ANSIBLE_STRATEGY_PLUGINS"] = strategy_plugins or str(HERE.parents[1] / "plugins" / "strategy")
    ap = Path(sys.executable).parent / "ansible-playbook"
    t0 = time.monotonic()
    subprocess.run(
        [str(ap) if ap.exists() else "ansible-playbook", "-i", str(inv), str(pb)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    doc = json.loads(account.read_text())
    end, main = doc["end"], doc["end"]["main"]
    n = len(doc["tasks"])
    return {
        "hosts": hosts,
        "kept": kept,
        "host_tasks": n,
        "wall_s": wall,
        "work_ms": main["work_s"] / n * 1000,
        "fork_ms": main["fork_s"] / max(1, main["forks"]) * 1000,
        "workers_ms": end["children_s"] / n * 1000,
        "rss_mib": end["maxrss_kib"] / 1024,
        "kept_kib": (end.get("host_state") or {}).get("bytes_per_host", 0) / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[25, 200])
    p.add_argument("--tasks", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median of each is printed")
    p.add_argument("--strategy", default="", help="a strategy plugin's name (default: Ansible's linear)")
    p.add_argument("--strategy-plugins", default="", help="where it lives (default: plugins/strategy)")
    p.add_argument("--kept", choices=("both", "yes", "no"), default="both",
                   help="with a package_facts-sized fact per host, without, or both (default)")
    args = p.parse_args(argv)
    runs: dict[tuple[bool, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="hami-growth-") as tmp:
        work = Path(tmp)
        (work / "none.cfg").write_text("[defaults]\n")
        for _ in range(args.rounds):  # interleaved: a noisy minute hits every case alike
            for kept in KEPT[args.kept]:
                for hosts in args.sizes:
                    runs.setdefault((kept, hosts), []).append(
                        run_once(work, hosts, args.tasks, kept, args.strategy, args.strategy_plugins))
    rows = [median_row(runs[key]) for key in sorted(runs)]
    print(
        f"{'kept per host':>16} {'hosts':>5} {'host-tasks':>10} {'main work ms':>12} {'fork ms':>8} "
        f"{'workers ms':>10} {'main RSS MiB':>12} {'wall s':>7}   (per host-task; wall: the run)"
    )
    for r in rows:
        label = f"{r['kept_kib']:.0f} KiB pickled" if r["kept"] else "nothing"
        print(
            f"{label:>16} {r['hosts']:>5} {r['host_tasks']:>10} {r['work_ms']:>12.2f} {r['fork_ms']:>8.2f} "
            f"{r['workers_ms']:>10.1f} {r['rss_mib']:>12.0f} {r['wall_s']:>7.1f}"
        )
    for kept in KEPT[args.kept]:
        sel = [r for r in rows if r["kept"] == kept]
        lo, hi = sel[0], sel[-1]
        print(
            f"{'kept' if kept else 'nothing kept'}: {hi['hosts'] / lo['hosts']:.0f}x hosts -> per host-task "
            f"main work x{hi['work_ms'] / lo['work_ms']:.2f}, fork x{hi['fork_ms'] / lo['fork_ms']:.2f}, "
            f"workers x{hi['workers_ms'] / lo['workers_ms']:.2f}, wall x{hi['wall_s'] / lo['wall_s']:.2f} "
            f"(medians of {args.rounds} rounds)"
        )
    return 0


def median_row(rows: list[dict]) -> dict:
    out = dict(rows[0])
    for key in ("work_ms", "fork_ms", "workers_ms", "rss_mib", "kept_kib", "wall_s"):
        out[key] = statistics.median(r[key] for r in rows)
    return out


if __name__ == "__main__":
    sys.exit(main())
