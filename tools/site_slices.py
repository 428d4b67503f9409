# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""site.yml over a fleet in slices: several ansible-playbook processes, one per-node account.

    python tools/site_slices.py --slices 4 -i INVENTORY [ansible-playbook options...]

Why: one ansible-playbook main process does its strategy loop, variables and results on one core, and its
cost per host-task grows with the number of hosts it holds (docs/performance.md, "Fleet"). AWX / Automation
Controller answer big inventories with "job slicing" (the inventory split into N slices, each run by its own
ansible-playbook: https://docs.ansible.com/automation-controller/latest/html/userguide/job_slices.html).
This runner does that for site.yml, with what a roll needs on top (docs/rollouts.md, "A fleet in slices"):

  phase 1  N concurrent runs, one per slice of the GPU nodes (round-robin over the inventory's order), with
           site_roll_defer=true: each plans and converges its nodes, cordons and rolls none, and leaves the
           once-per-run cluster plays (scheduler, admission guard, cluster-wide RBAC, DRA classes) alone;
  phase 2  ONE run over the scheduler hosts and the nodes whose roll was deferred (or, when none was, one
           converged node that carries the cluster-wide writes): the roll's budgets, failure domains and
           canary see the whole fleet's disruptions in one process.

Then one merged account (the format fleet_account prints, plus the slice of each node), written beside the
rollout report, and an exit code that is 0 only when nothing needs attention. Standard library + PyYAML.
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling module, also when this file is imported by its path
from site_slices_account import exit_code, merge, render, write  # noqa: E402

SITE = HERE.parent / "playbooks" / "site.yml"
CALLBACK = "hami.node.fleet_account"
WHEELHOUSE = Path("~/.cache/hami-node/wheelhouse").expanduser()  # hami_agent_build_dir's default
# set by the runner itself: a user's value would be overridden silently
OWN_VARS = ("site_roll_defer", "site_slices_failed", "hami_rbac_apply_cluster")
STOP_GRACE_S = 20.0  # after SIGINT, before SIGKILL: ansible-playbook ends its workers and writes its account
TIMEOUT_RC = 124


class Refusal(Exception):
    """Bad input found before anything ran: nothing was written."""


# ------------------------------------------------------------------------------------------ the arguments
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="site_slices.py",
        allow_abbrev=False,
        description="Run hami.node's site.yml over a fleet in slices (docs/rollouts.md). "
        "Options it does not know go to every ansible-playbook unchanged.",
    )
    p.add_argument(
        "--slices", type=int, required=True, help="concurrent ansible-playbook processes in phase 1"
    )
    p.add_argument(
        "--slice-timeout",
        type=float,
        default=3600.0,
        help="seconds a phase-1 slice may run before it is stopped (default 3600)",
    )
    p.add_argument(
        "--final-timeout",
        type=float,
        default=6 * 3600.0,
        help="seconds the final run (the roll) may take (default 21600)",
    )
    p.add_argument("--playbook", default=str(SITE), help="site.yml to run (default: this collection's)")
    p.add_argument(
        "--run-dir",
        default="",
        help="slice logs and accounts (default: a new directory under "
        "$HAMI_NODE_ACCOUNT_DIR or ~/.ansible/hami-node/runs)",
    )
    p.add_argument("-i", "--inventory", action="append", default=[])
    p.add_argument("-l", "--limit", default="")
    p.add_argument("-e", "--extra-vars", action="append", default=[])
    return p.parse_known_args(argv)


def extra_vars(values: list[str], cwd: Path) -> dict:
    """What the user's -e options set (key=value, YAML/JSON, or @file), to find site_gpu_nodes and friends."""
    out: dict = {}
    for raw in values:
        text = raw.strip()
        try:
            if text.startswith("@"):
                path = (cwd / text[1:]).expanduser()
                if not path.is_file():
                    raise Refusal(f"-e {raw}: no such file; name an existing vars file")
                data = yaml.safe_load(path.read_text()) or {}
            elif text.startswith(("{", "[")):
                data = yaml.safe_load(text)
            else:
                # key=value pairs, quoted as Ansible accepts them
                data = dict(kv.split("=", 1) for kv in shlex.split(text) if "=" in kv)
        except yaml.YAMLError as exc:
            raise Refusal(f"-e {raw}: not valid YAML/JSON ({exc}); fix the value") from exc
        if not isinstance(data, dict):
            raise Refusal(f"-e {raw}: must set variables (key=value, a mapping, or @file)")
        out.update(data)
    return out


def check(args: argparse.Namespace, rest: list[str], cwd: Path) -> dict:
    """Every refusal before anything runs; returns the user's extra vars."""
    if args.slices < 1:
        raise Refusal(f"--slices {args.slices}: must be 1 or more (e.g. --slices 4: one per 250 nodes)")
    if args.slice_timeout <= 0 or args.final_timeout <= 0:
        raise Refusal("--slice-timeout and --final-timeout are seconds > 0 (e.g. --slice-timeout 3600)")
    if not args.inventory:
        raise Refusal("no inventory: name it with -i INVENTORY, as for ansible-playbook")
    for inv in args.inventory:
        if "," not in inv and not (cwd / inv).expanduser().exists():
            raise Refusal(f"-i {inv}: no such inventory file or directory; name an existing inventory")
    if not Path(args.playbook).is_file():
        raise Refusal(f"--playbook {args.playbook}: no such file; name site.yml of the hami.node collection")
    books = [a for a in rest if a.endswith((".yml", ".yaml")) and not a.startswith("-")]
    if books:
        raise Refusal(f"{books[0]}: the runner runs site.yml itself; name another one with --playbook")
    if shutil.which("ansible-playbook") is None or shutil.which("ansible") is None:
        raise Refusal(
            "ansible-playbook / ansible not on PATH: activate the environment Ansible is installed in"
        )
    user = extra_vars(args.extra_vars, cwd)
    own = [k for k in OWN_VARS if k in user]
    if own:
        raise Refusal(f"-e {own[0]}: the runner sets it for each phase; drop it from your -e")
    return user


# ------------------------------------------------------------------------------------------- the fleet
def list_hosts(pattern: str, args: argparse.Namespace, rest_env: dict, extra: list[str]) -> list[str]:
    """The hosts ansible-playbook would run ``pattern`` on, in the inventory's order (the user's --limit
    applied): Ansible's own pattern matching, not a copy of it."""
    argv = ["ansible", pattern, "--list-hosts"]
    for inv in args.inventory:
        argv += ["-i", inv]
    if args.limit:
        argv += ["--limit", args.limit]
    argv += extra
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=rest_env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Refusal(f"`ansible {pattern} --list-hosts` took more than 300 s: check the inventory") from exc
    if proc.returncode != 0:
        raise Refusal(f"`{' '.join(argv)}` failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
    lines = proc.stdout.splitlines()
    return [ln.strip() for ln in lines if ln.startswith("    ") and ln.strip()]


def partition(hosts: list[str], slices: int) -> list[list[str]]:
    """Round-robin over the inventory's order. Nothing is disrupted in phase 1, so a failure domain need not
    stay in one slice (phase 2 rolls it in one process); round-robin spreads an inventory listed by
    hardware or rack (different drivers, different work) evenly, and the slowest slice sets the wall."""
    parts = [hosts[i::slices] for i in range(min(slices, len(hosts)))]
    return [p for p in parts if p]


def callbacks_enabled(env: dict, cwd: Path) -> str:
    """The user's callbacks plus fleet_account (its per-process accounts are what the runner merges)."""
    current = env.get("ANSIBLE_CALLBACKS_ENABLED")
    if current is None:  # as Ansible searches for its configuration
        current = ""
        for cand in (
            env.get("ANSIBLE_CONFIG", ""),
            str(cwd / "ansible.cfg"),
            "~/.ansible.cfg",
            "/etc/ansible/ansible.cfg",
        ):
            path = Path(cand).expanduser() if cand else None
            if path and path.is_file():
                cfg = configparser.ConfigParser(interpolation=None, strict=False)
                cfg.read(path)
                current = cfg.get("defaults", "callbacks_enabled", fallback="")
                break
    names = [c.strip() for c in current.split(",") if c.strip()]
    return ",".join(names + ([] if CALLBACK in names else [CALLBACK]))


# ------------------------------------------------------------------------------------- the processes
class Run:
    """One ansible-playbook process: a slice (``name`` 1..N) or the final run (``name`` "final")."""

    def __init__(self, name, hosts: list[str], argv: list[str], env: dict, run_dir: Path, timeout: float):
        self.name, self.hosts, self.timeout = name, hosts, timeout
        self.account_file = run_dir / f"account-{name}.json"
        self.log = run_dir / f"{name if name == 'final' else 'slice-%s' % name}.log"
        self.argv, self.env = argv, {**env, "HAMI_NODE_ACCOUNT_FILE": str(self.account_file)}
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.status = "not started"
        self.started = self.ended = 0.0

    def start(self) -> None:
        with open(self.log, "w") as log:
            # its own session: a timeout stops its whole tree (Ansible's forked workers too), and the
            # terminal's Ctrl-C reaches the runner, which stops every child the same way
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started = time.monotonic()
        self.status = "running"

    def poll(self) -> bool:
        """True once it has ended (or been stopped for running past its timeout)."""
        if self.rc is not None:
            return True
        rc = self.proc.poll()
        if rc is None and time.monotonic() - self.started > self.timeout:
            self.stop()
            self.status, self.rc = "timeout", TIMEOUT_RC
        elif rc is not None:
            self.rc, self.status = rc, "ended"
        if self.rc is not None:
            self.ended = time.monotonic()
        return self.rc is not None

    def stop(self) -> None:
        """SIGINT to its process group (Ansible ends its workers), SIGKILL after STOP_GRACE_S."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def account(self) -> dict | None:
        try:
            return json.loads(self.account_file.read_text())
        except (OSError, ValueError):
            return None

    def summary(self) -> dict:
        return {
            "slice": self.name,
            "hosts": len(self.hosts),
            "rc": self.rc,
            "status": self.status,
            "seconds": round(max(0.0, self.ended - self.started), 1),
            "log": str(self.log),
        }


def _label(run: Run) -> str:
    return "the final run" if run.name == "final" else f"slice {run.name}"


def run_all(runs: list[Run], say) -> None:
    """Start them all, wait for each within its timeout; whatever happens, none is left running."""
    try:
        for r in runs:
            r.start()
            say(f"{_label(r)}: {len(r.hosts)} host(s), log {r.log}")
        pending = list(runs)
        while pending:
            for r in [r for r in pending if r.poll()]:
                pending.remove(r)
                how = f"stopped after {r.timeout:.0f}s (timeout)" if r.status == "timeout" else f"exit {r.rc}"
                say(f"{_label(r)}: {how} after {r.ended - r.started:.0f}s")
            time.sleep(0.2)
    finally:
        for r in runs:
            r.stop()


# ------------------------------------------------------------------------------------------- the runner
def final_hosts(slices: list[Run], schedulers: list[str]) -> tuple[list[str], list[str], list[str], str]:
    """Phase 2's hosts: the scheduler hosts, the nodes whose roll was deferred and, when no node was
    deferred, one converged node that carries the converge play's cluster-wide writes (RBAC, DRA
    DeviceClasses). Also the nodes that failed in the slices (the roll's failure bound counts them)."""
    deferred, failed, healthy = [], [], []
    for r in slices:
        nodes = (r.account() or {}).get("nodes") or {}
        for h in r.hosts:
            state = (nodes.get(h) or {}).get("state", "failed")
            if state == "pending roll":
                deferred.append(h)
            elif state in ("failed", "unreachable"):
                failed.append(h)
            elif state in ("converged", "changed"):
                healthy.append(h)
    carrier = "" if deferred or not healthy else healthy[0]
    hosts = list(dict.fromkeys(schedulers + deferred + ([carrier] if carrier else [])))
    return hosts, deferred, failed, carrier


def main(argv: list[str] | None = None, say=print) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cwd = Path.cwd()
    try:
        args, rest = parse_args(argv)
        user = check(args, rest, cwd)
        env = dict(os.environ)
        env["ANSIBLE_CALLBACKS_ENABLED"] = callbacks_enabled(env, cwd)
        user_e = [x for e in args.extra_vars for x in ("-e", e)]
        gpu = list_hosts(str(user.get("site_gpu_nodes") or "gpu_nodes"), args, env, user_e)
        schedulers = list_hosts(str(user.get("site_scheduler_hosts") or "hami_scheduler"), args, env, user_e)
        if not gpu and not schedulers:
            raise Refusal(
                "no GPU node and no scheduler host in the inventory (after --limit): check -i, "
                "--limit and site_gpu_nodes / site_scheduler_hosts"
            )
    except Refusal as exc:
        say(f"site_slices.py: refused: {exc}")
        return 2
    except SystemExit as exc:  # argparse's own refusal (it printed the usage)
        return int(exc.code or 2)

    started = time.time()
    base = Path(os.environ.get("HAMI_NODE_ACCOUNT_DIR") or "~/.ansible/hami-node/runs").expanduser()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path(args.run_dir).expanduser() if args.run_dir else base / f"{stamp}-slices"
    run_dir.mkdir(parents=True, exist_ok=True)
    invs = [x for inv in args.inventory for x in ("-i", inv)]
    playbook = ["ansible-playbook", *invs, args.playbook, *rest, *user_e]

    stop = {"signal": 0}

    def on_signal(signum, _frame):
        stop["signal"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    slices: list[Run] = []
    final: Run | None = None
    try:
        parts = partition(gpu, args.slices)
        for i, hosts in enumerate(parts, 1):
            (run_dir / f"slice-{i}.limit").write_text("".join(f"{h}\n" for h in hosts))
            own = {
                "site_roll_defer": True,
                "hami_rbac_apply_cluster": False,
                "hami_agent_dra_kubeconfig": "",
                # each slice its own wheelhouse (K processes writing and packing one directory race; the
                # role builds from a private copy of the source for the same reason), beside the role's
                # default one and kept from run to run like it (pip reuses what is there)
                "hami_agent_build_dir": str(WHEELHOUSE.with_name(f"{WHEELHOUSE.name}-slice-{i}")),
            }
            (run_dir / f"slice-{i}.vars.json").write_text(json.dumps(own))
            argv = [
                *playbook,
                "--limit",
                f"@{run_dir / f'slice-{i}.limit'}",
                "-e",
                f"@{run_dir / f'slice-{i}.vars.json'}",
            ]
            slices.append(Run(i, hosts, argv, env, run_dir, args.slice_timeout))
        say(f"phase 1: {len(gpu)} GPU node(s) in {len(slices)} slice(s), nothing rolled; run dir {run_dir}")
        run_all(slices, say)

        hosts, deferred, failed, carrier = final_hosts(slices, schedulers)
        if hosts:
            (run_dir / "final.limit").write_text("".join(f"{h}\n" for h in hosts))
            (run_dir / "final.vars.json").write_text(json.dumps({"site_slices_failed": failed}))
            argv = [
                *playbook,
                "--limit",
                f"@{run_dir / 'final.limit'}",
                "-e",
                f"@{run_dir / 'final.vars.json'}",
            ]
            final = Run("final", hosts, argv, env, run_dir, args.final_timeout)
            say(
                f"phase 2: one run over {len(schedulers)} scheduler host(s), {len(deferred)} node(s) to roll"
                + (f", {carrier} (carries the cluster-wide writes)" if carrier else "")
            )
            run_all([final], say)
        else:
            say("phase 2: nothing to run (no scheduler host, no node to roll, no converged node)")
    except KeyboardInterrupt:
        for r in slices + ([final] if final else []):
            r.stop()
        say(
            f"site_slices.py: interrupted (signal {stop['signal'] or signal.SIGINT}): every ansible-playbook "
            f"was stopped; logs in {run_dir}"
        )
        return 130
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)

    doc = merge(slices, final, started, carrier)
    where = write(doc, run_dir)
    say("HAMI.NODE ACCOUNT (%s, %d host(s), %.0fs)" % (doc["playbook"], len(doc["nodes"]), doc["seconds"]))
    for line in render(doc):
        say(line)
    hint = f"; rerun only those: --limit @{where / '_needs-attention.txt'}" if doc["needs_attention"] else ""
    say(f"account: {where / '_account.json'}{hint}")
    return exit_code(doc)


if __name__ == "__main__":
    sys.exit(main())
