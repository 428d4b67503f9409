# Over 500 lines on purpose: one benchmark read top to bottom (runs, variants, report, CLI).
"""The provisioning half at fleet size (issue 26, item 3): ``playbooks/site.yml`` converged over 25, 50 and
100 SIMULATED GPU nodes on this machine, and a projection of a converged 1,000-node run.

Hosts (``hosts.py``): podman containers of the sandbox's node shape (systemd, apt, the simulated NVIDIA
packages, gpusim, the real agent's device plugin and monitor as systemd services), cloned from one node
converged by site.yml, each with its own name and agent ports; one process of SIMULATED kubelets for all
of them (``kubelets.py``); the SIMULATED API server in its own process with N Node objects. Ansible reaches
the hosts through ``connection_plugins/fleet_nsenter.py`` (the container's namespaces, pipelined; the
collection's ``podman_pipelined`` is measured as a variant) and accounts every host-task, its controller CPU
and the API requests of each play through ``callback_plugins/fleet_bench_account.py``.

For each size: every created host keeps running (the biggest size's daemons are every size's background,
so the growth between sizes is the run's own; ``--pause-others`` pauses the hosts outside the size, as
before 2026-11-29), the hosts' idle CPU is measured first, then one converged ``ansible-playbook
playbooks/site.yml`` over that many hosts (must report changed=0 everywhere).
Figures: wall time, host-tasks per host, seconds per host-task, growth, controller CPU (main process /
workers) vs host CPU per host-task, API requests per host in the plan play by verb, output lines per host,
which roles and tasks cost most, and the projection of ``model.py``. Variants (``--variants``) measure
Ansible's speed-ups at one size: forks, fact caching, ``gather_subset``, ``strategy: free``, the podman
connection, and a ``profile_tasks`` run.

Run: ``flock /work/podman.lock python -m benchmarks fleet`` (root, podman; ~1 h; not in ``make bench``);
``--quick``: 3 and 6 hosts, no variants (~10 min). ``--help`` works without podman.
"""

from __future__ import annotations

import argparse
import configparser
import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import goals
from benchmarks.fleet import inventory as inv
from benchmarks.fleet import model, slices

RUN_BY_DEFAULT = False  # a full run takes about an hour; `python -m benchmarks fleet` runs it
SUMMARY: list[tuple[str, str, str, bool]] = []  # the last run's figures, for the summary table

HERE = Path(__file__).resolve().parent
REPO = inv.REPO
DEFAULT_RUN_DIR = Path(os.environ.get("HAMI_FLEET_DIR", "/var/tmp/hami-fleet"))
CACHE_DIR = Path(os.environ.get("HAMI_FLEET_CACHE", "/var/tmp/hami-fleet-cache"))
GOLD = 0  # host index of the golden node
UNPAUSE_SETTLE_S = 60.0
PROFILE = inv.GPUSIM_PROFILE
# production-like agents on the light hosts: the sandbox's chatty settings (verbosity 4, NVML refresh every
# 2 s) would charge the idle fleet's CPU to this machine's two cores, which the controller shares
FLEET_VARS = {"hami_agent_verbosity": 0, "hami_agent_device_plugin_extra_args": ["--mig-strategy=mixed"]}
VARIANTS = (
    "base",
    "forks5",
    "forks25",
    "forks50",
    "facts-cache",
    "gather-all",
    "free-quiet",
    "poll",
    "linear-builtin",
    "nopipe",
    "podman",
    "profile",
    "cprofile",
)
# free-quiet: Ansible runs run_once tasks on every host under `strategy: free` ("not currently supported"),
# so every host builds and packs the agent's wheels into the same directory at once. Only when named.
UNSAFE_VARIANTS = ("free-quiet",)
GOALS = {"projected_s": 15 * 60, "roll_h": 2.5}


def say(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- config
def repo_cfg(root: Path = REPO) -> dict[str, str]:
    """[defaults] of the repository's ansible.cfg (the documented settings), if it ships one."""
    cfg = root / "ansible.cfg"
    if not cfg.exists():
        return {}
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(cfg)
    return dict(cp["defaults"]) if cp.has_section("defaults") else {}


def documented_forks(root: Path = REPO) -> int:
    try:
        return int(repo_cfg(root).get("forks", 5))
    except ValueError:
        return 5


def variant_env(name: str, forks: int, run_dir: Path) -> dict[str, str]:
    """Environment of a variant run: the series' settings (``forks``) with one thing changed."""
    env = {"ANSIBLE_FORKS": str(forks)}
    if name.startswith("forks"):
        return {"ANSIBLE_FORKS": name[5:]}
    cache_dir = run_dir / "facts"
    if name == "facts-cache":
        return {
            **env,
            "ANSIBLE_GATHERING": "smart",
            "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache_dir),
            "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "86400",
        }
    if name == "nopipe":  # modules copied to a temporary directory and run, as without pipelining over ssh
        return {**env, "HAMI_FLEETBENCH_NO_PIPELINING": "1", "ANSIBLE_PIPELINING": "False"}
    if name == "profile":
        return {**env, "HAMI_FLEET_PROFILE": "1"}
    if name == "cprofile":
        return {**env, "HAMI_FLEET_CPROFILE": str(run_dir / "results" / "cprofile.out")}
    if name == "poll":
        # internal_poll_interval has no environment variable: a copy of the repository's ansible.cfg
        cfg = run_dir / "ansible-poll.cfg"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(
            poll_cfg((REPO / "ansible.cfg").read_text() if (REPO / "ansible.cfg").exists() else "", 0.01)
        )
        return {**env, "ANSIBLE_CONFIG": str(cfg)}
    return env


def poll_cfg(text: str, interval: float) -> str:
    """An ansible.cfg = ``text`` with ``internal_poll_interval`` set in [defaults]."""
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(text)
    if not cp.has_section("defaults"):
        cp.add_section("defaults")
    cp.set("defaults", "internal_poll_interval", str(interval))
    out = io.StringIO()
    cp.write(out)
    return out.getvalue()


PLAYBOOK_VARIANTS = ("gather-all", "facts-cache", "free-quiet", "linear-builtin")
SETUP = ("ansible.builtin.setup", "setup")


def walk_tasks(tasks: list[dict[str, Any]] | None):  # -> Iterator[dict]
    """Every task of a task list, inside blocks (block / rescue / always) too."""
    for t in tasks or []:
        yield t
        for key in ("block", "rescue", "always"):
            if isinstance(t.get(key), list):
                yield from walk_tasks(t[key])


def _plan_play(plays: list[dict[str, Any]]) -> dict[str, Any]:
    for p in plays:
        if str(p.get("name", "")).lower().startswith("plan"):
            return p
    raise ValueError("site.yml has no play named 'Plan ...'")


def site_variant(text: str, variant: str) -> str:
    """site.yml with one thing changed for one measurement (the file itself is never changed):

    - ``gather-all``: the plan play gathers every fact (its ``setup`` without ``gather_subset``; or, in a
      site.yml that gathers implicitly, ``gather_subset`` left to Ansible's default): what gathering only
      ``distribution`` saves;
    - ``facts-cache``: the plan play's ``setup`` runs only for a host without cached facts (with a fact cache
      plugin in the environment, a second run gathers nothing);
    - ``free-quiet``: the converge play (nothing disruptive; order does not matter) under ``strategy: free``;
    - ``linear-builtin``: site.yml's plays under Ansible's own ``linear``, not ``hami.node.linear_fleet``
      (parts/roll.yml keeps its strategy: a converged run rolls no node).
    """
    import yaml

    plays = yaml.safe_load(text)
    if variant in ("gather-all", "facts-cache"):
        play = _plan_play(plays)
        setups = [t for t in walk_tasks(play.get("tasks")) if any(k in t for k in SETUP)]
        if variant == "gather-all":
            for t in setups:
                args = t[next(k for k in SETUP if k in t)]
                if isinstance(args, dict):
                    args.pop("gather_subset", None)
            play.pop("gather_subset", None)
        else:
            for t in setups:
                cond = t.get("when", [])
                t["when"] = [
                    *(cond if isinstance(cond, list) else [cond]),
                    "ansible_facts['os_family'] is not defined",
                ]
        if not setups and variant == "facts-cache":
            raise ValueError("the plan play has no setup task to skip")
    elif variant == "free-quiet":
        hits = [
            p
            for p in plays
            if "site_converge" in str(p.get("hosts", "")) or p.get("hosts") == "site_rollout_quiet"
        ]
        if not hits:
            raise ValueError("site.yml has no converge play")
        for p in hits:
            p["strategy"] = "free"
    elif variant == "linear-builtin":
        hits = [p for p in plays if "linear_fleet" in str(p.get("strategy", ""))]
        if not hits:
            raise ValueError("site.yml has no play under hami.node.linear_fleet")
        for p in hits:
            p["strategy"] = "ansible.builtin.linear"
    else:
        raise ValueError(variant)
    return "---\n" + yaml.safe_dump(plays, sort_keys=False, width=4096)


# ---------------------------------------------------------------------------------------------- runs
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from benchmarks.fleet.hosts import Fleet
        from sandbox.procs import ProcessManager

        self.args = args
        self.run_dir = Path(args.run_dir)
        self.fleet = Fleet(self.run_dir, args.base_port, say)
        self.procs = ProcessManager(self.run_dir / "pids", self.run_dir / "logs")
        self.api: Any = None
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.map_file = self.run_dir / "nsenter-map.json"
        self.results: dict[str, Any] = {"sizes": [], "variants": [], "gold": {}}
        self.paused: set[str] = set()

    # -------------------------------------------------------------------------------- infrastructure
    def check_inotify(self, n: int) -> None:
        from benchmarks.fleet.hosts import inotify_limit, inotify_needed

        have, need = inotify_limit(), inotify_needed(n)
        if have is not None and have < need:
            raise SystemExit(
                f"fleet: fs.inotify.max_user_instances is {have}; {n} systemd containers need about {need} "
                f"(else their boot stalls): sysctl -w fs.inotify.max_user_instances={max(need, 8192)}"
            )

    def check_ports(self, n: int) -> None:
        from sandbox.cluster import port_free

        busy = [p for p in [self.args.api_port, *inv.port_range(n, self.args.base_port)] if not port_free(p)]
        if busy:
            raise SystemExit(
                f"fleet: ports in use: {busy[:10]}{'...' if len(busy) > 10 else ''}; pick another "
                "--base-port / --api-port (every host listens on the host network)"
            )

    def start_api(self) -> None:
        from benchmarks.apiserver_proc import ApiServerProcess

        api_dir = self.run_dir / "api"
        shutil.rmtree(api_dir, ignore_errors=True)
        self.api = ApiServerProcess(str(api_dir), port=self.args.api_port, history=400_000)
        shutil.copyfile(self.api.kubeconfig_path, self.kubeconfig)
        os.chmod(self.kubeconfig, 0o644)

    def create_nodes(self, names: list[str]) -> None:
        from hami_agent.k8s.client import KubeClient

        client = KubeClient.from_kubeconfig(str(self.kubeconfig), timeout_s=10, component="fleet-bench")
        for n in names:
            client.create(
                "nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": n,
                        "labels": {"kubernetes.io/hostname": n, "gpu": "on", "hami.io/fleet": "true"},
                    },
                },
            )
        client.close()

    def start_kubelets(self, name: str, nodes: list[str]) -> None:
        nodes_file = self.run_dir / f"{name}.nodes"
        nodes_file.write_text("".join(f"{n} {self.fleet.device_plugin_dir(n)}\n" for n in nodes))
        ready = self.run_dir / f"{name}.ready"
        ready.unlink(missing_ok=True)
        env = {"PYTHONPATH": str(REPO)}
        self.procs.start(
            name,
            [
                sys.executable,
                "-m",
                "benchmarks.fleet.kubelets",
                "--kubeconfig",
                str(self.kubeconfig),
                "--nodes-file",
                str(nodes_file),
                "--ready-file",
                str(ready),
            ],
            env=env,
            cwd=REPO,
        )
        end = time.monotonic() + 120
        while not ready.exists():
            if not self.procs.running(name) or time.monotonic() > end:
                log = self.procs.log_path(name)
                raise RuntimeError(f"{name} did not start: {log.read_text()[-1500:] if log.exists() else ''}")
            time.sleep(0.2)

    def write_map(self, names: list[str]) -> None:
        doc = self.fleet.nsenter_map(names)
        tmp = self.map_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.map_file)

    def collections(self) -> Path:
        coll = self.run_dir / "collections" / "ansible_collections" / "hami"
        coll.mkdir(parents=True, exist_ok=True)
        link = coll / "node"
        # re-pointed when it leads elsewhere: a run dir outlives the checkout that made it (another worktree)
        if not link.is_symlink() or Path(os.readlink(link)) != REPO:
            link.unlink(missing_ok=True)
            link.symlink_to(REPO)
        return self.run_dir / "collections"

    def inventory_dir(self, tag: str, indices: list[int], connection: str = "fleet_nsenter") -> Path:
        gv = inv.group_vars(self.run_dir, self.kubeconfig)
        gv.update(FLEET_VARS)
        return inv.write(
            self.run_dir / "inventories" / tag,
            inv.inventory(indices, self.args.base_port, connection=connection),
            gv,
        )

    def ansible(
        self,
        playbook: Path,
        inventory: Path,
        tag: str,
        env: dict[str, str] | None = None,
        extra: list[str] | None = None,
        timeout_s: float | None = None,
        sliced: bool = False,
    ) -> dict[str, Any]:
        """One ansible-playbook run with the account callback; returns rc, wall, output lines, account.
        ``sliced``: tools/site_slices.py in ``--slices`` processes instead (its accounts merged)."""
        from sandbox.cluster import _stream

        env = dict(env or {})
        cfg = repo_cfg()
        callbacks = [c.strip() for c in cfg.get("callbacks_enabled", "").split(",") if c.strip()]
        callbacks.append("fleet_bench_account")
        if env.pop("HAMI_FLEET_PROFILE", ""):
            callbacks += ["ansible.posix.profile_tasks", "ansible.posix.profile_roles"]
        account = self.run_dir / "accounts" / f"{tag}.json"
        account.parent.mkdir(parents=True, exist_ok=True)
        account.unlink(missing_ok=True)
        if sliced:  # one account per process of the runner (benchmarks/fleet/slices.py)
            account = self.run_dir / "accounts" / f"{tag}-{{run}}.json"
            for old in account.parent.glob(f"{tag}-account-*.json"):
                old.unlink()
        colls = f"{self.collections()}:{os.environ.get('ANSIBLE_COLLECTIONS_PATH', '')}".rstrip(":")
        full_env = {
            "ANSIBLE_COLLECTIONS_PATH": colls,
            "ANSIBLE_INJECT_FACT_VARS": "False",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCAL_TEMP": str(self.run_dir / "ansible-tmp"),
            "ANSIBLE_CALLBACKS_ENABLED": ",".join(callbacks),
            "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
            "ANSIBLE_CONNECTION_PLUGINS": str(HERE / "connection_plugins"),
            "HAMI_FLEETBENCH_NSENTER_MAP": str(self.map_file),
            "HAMI_FLEETBENCH_ACCOUNT": str(account),
            "HAMI_FLEETBENCH_API_DIR": str(self.api.dir) if self.api else "",
            "KUBECONFIG": str(self.kubeconfig),
            "HAMI_SANDBOX_DIR": str(self.run_dir),
            # the collection's own per-node account (ansible.cfg enables it) writes here, not to ~/.ansible
            "HAMI_NODE_ACCOUNT_DIR": str(self.run_dir / "node-accounts"),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        argv = [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(playbook),
            *(extra or []),
        ]
        if sliced:  # the runner finds ansible and ansible-playbook on PATH
            full_env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
            run_dir, limit = self.run_dir / "slices" / tag, timeout_s or self.args.run_timeout
            argv = slices.argv(
                sys.executable, self.args.slices, inventory, playbook, run_dir, limit, extra or []
            )
        prof = full_env.pop("HAMI_FLEET_CPROFILE", "")
        if prof:  # the main process under cProfile (the forked workers inherit it; only the main one writes)
            Path(prof).parent.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-m", "cProfile", "-o", prof, *argv]
        log = self.run_dir / "logs" / f"ansible-{tag}.log"
        t0 = time.monotonic()
        proc = _stream(
            argv, timeout_s or self.args.run_timeout, f"ansible-playbook {tag}", log, full_env, None
        )
        wall = time.monotonic() - t0
        if sliced:
            docs = slices.accounts(str(account))
            doc = {**slices.merge(docs), "processes": docs}
        else:
            doc = json.loads(account.read_text()) if account.exists() else {}
        return {
            "rc": proc.returncode,
            "wall_s": wall,
            "lines": len(proc.stdout.splitlines()),
            "account": doc,
            "log": str(log),
            "tail": proc.stdout[-3000:],
        }

    # -------------------------------------------------------------------------------- the golden node
    def gold_key(self) -> str:
        from benchmarks.fleet.hosts import input_key

        return input_key(f"{self.args.base_port}:{self.args.api_port}:{json.dumps(FLEET_VARS)}")

    def ensure_gold(self) -> dict[str, Any]:
        """The converged image, its identity files and its gpusim state (cached by the inputs' hash)."""
        from benchmarks.fleet.hosts import GOLD_IMAGE
        from sandbox import podman

        key = self.gold_key()
        cache = CACHE_DIR / f"gold-{key}"
        image = f"{GOLD_IMAGE}:{key}"
        meta_file = cache / "gold.json"
        if (
            not self.args.rebuild_gold
            and meta_file.exists()
            and podman.cli("image", "exists", image, check=False).returncode == 0
        ):
            say(f"golden node: cached image {image}")
            return json.loads(meta_file.read_text())
        name = inv.host_name(GOLD)
        self.fleet.init_dirs(name)
        self.fleet.gpusim_init(name, PROFILE)
        self.start_kubelets("kubelets-gold", [name])
        from sandbox.config import IMAGE

        self.fleet.create(name, IMAGE, start=True)
        self.fleet.wait_booted([name], 120)
        self.write_map([name])
        gold_inv = self.inventory_dir("gold", [GOLD])
        t0 = time.monotonic()
        r = self.ansible(REPO / "sandbox" / "playbooks" / "prepare.yml", gold_inv, "gold-prepare")
        if r["rc"]:
            raise RuntimeError(f"golden node: prepare.yml failed ({r['log']}):\n{r['tail']}")
        r = self.ansible(REPO / "playbooks" / "site.yml", gold_inv, "gold-converge")
        if r["rc"]:
            raise RuntimeError(f"golden node: site.yml failed ({r['log']}):\n{r['tail']}")
        converge_s = time.monotonic() - t0
        r2 = self.ansible(REPO / "playbooks" / "site.yml", gold_inv, "gold-check")
        changed = sum(s.get("changed", 0) for s in r2["account"].get("stats", {}).values())
        if r2["rc"] or changed:
            raise RuntimeError(
                f"golden node: the second site.yml run is not converged (rc {r2['rc']}, "
                f"changed={changed}; {r2['log']})"
            )
        dp, mon = inv.host_ports(GOLD, self.args.base_port)
        tokens = [name, f"127.0.0.1:{dp}", f"127.0.0.1:{mon}"]
        files = self.fleet.find_identity_files(name, tokens)
        say(
            f"golden node: converged in {converge_s:.0f}s, one-host converged run {r2['wall_s']:.0f}s; "
            f"identity in {files}"
        )
        podman.cli("stop", "-t", "20", name, timeout_s=90)
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        podman.cli("commit", "--quiet", name, image, timeout_s=600)
        from benchmarks.fleet.hosts import copy_dir

        copy_dir(self.fleet.gpusim_dir(name), cache / "etc-gpusim")
        copy_dir(self.fleet.sysfs_dir(name), cache / "run-gpusim")
        meta = {
            "key": key,
            "image": image,
            "identity_files": files,
            "tokens": tokens,
            "converge_s": converge_s,
            "one_host_converged_s": r2["wall_s"],
            "one_host_tasks": len(r2["account"].get("tasks", [])),
        }
        meta_file.write_text(json.dumps(meta, indent=2))
        podman.remove(name)
        self.procs.stop("kubelets-gold")
        return meta

    def build(self) -> None:
        from sandbox.cluster import Sandbox
        from sandbox.config import load

        cfg = load(self.run_dir)
        Sandbox(cfg, progress=say).build()  # gpusim, node image, apt repo, stand-in libvgpu.so (cached)

    # -------------------------------------------------------------------------------- the clones
    def start_clones(self, gold: dict[str, Any], indices: list[int]) -> list[str]:
        from benchmarks.fleet.hosts import copy_dir

        cache = CACHE_DIR / f"gold-{gold['key']}"
        names = [inv.host_name(i) for i in indices]
        say(f"clones: create {len(names)} hosts from {gold['image']}")
        for i, name in zip(indices, names, strict=False):
            self.fleet.init_dirs(name)
            copy_dir(cache / "etc-gpusim", self.fleet.gpusim_dir(name))
            self.fleet.personalize_gpusim(name)
            copy_dir(cache / "run-gpusim", self.fleet.sysfs_dir(name))
            self.fleet.create(name, gold["image"], start=False)
            dp, mon = inv.host_ports(i, self.args.base_port)
            old_name, old_dp, old_mon = gold["tokens"]
            self.fleet.patch_identity(
                name,
                gold["identity_files"],
                {old_name: name, old_dp: f"127.0.0.1:{dp}", old_mon: f"127.0.0.1:{mon}"},
            )
        self.start_kubelets("kubelets", names)
        say(f"clones: start {len(names)} hosts (systemd boots, agents start)")
        self.fleet.start(names)
        self.fleet.wait_booted(names, timeout_s=600)
        self.write_map(names)
        urls = []
        for i in indices:
            dp, mon = inv.host_ports(i, self.args.base_port)
            urls += [f"http://127.0.0.1:{dp}/healthz", f"http://127.0.0.1:{mon}/metrics"]
        left = self.fleet.wait_http(urls, 300)
        if left:
            raise RuntimeError(f"clones: {len(left)} agent endpoints never answered, e.g. {left[:4]}")
        say(f"clones: {len(names)} hosts up, every device plugin healthy and every monitor serving")
        return names

    def only_running(self, names: list[str], active: list[str]) -> None:
        """Pause every host outside ``active`` (no CPU), unpause ``active``."""
        from sandbox import podman

        paused = self.paused
        to_pause = [n for n in names if n not in active and n not in paused]
        to_unpause = [n for n in active if n in paused]
        for k in range(0, len(to_pause), 25):
            podman.cli("pause", *to_pause[k : k + 25], timeout_s=120)
        for k in range(0, len(to_unpause), 25):
            podman.cli("unpause", *to_unpause[k : k + 25], timeout_s=120)
        self.paused = (paused | set(to_pause)) - set(to_unpause)
        if to_unpause:
            # Thawed agents catch up on the timers and deadlines that passed while frozen (2026-11-28: 1.05
            # cores for 75 thawed hosts in the 10 s before a run, against 0.18 settled), which the next
            # measurement would be charged for.
            say(f"hosts: {len(to_unpause)} unpaused; {UNPAUSE_SETTLE_S:.0f} s for their agents to settle")
            time.sleep(UNPAUSE_SETTLE_S)

    def helpers_cpu(self) -> float:
        """CPU seconds so far of the benchmark's own processes: this one (not its reaped children: the
        controller is counted by its account), the simulated API server and the simulated kubelets."""
        from benchmarks.procstat import process_cpu_or_zero

        t = os.times()
        pids = [self.procs.pid(n) for n in self.procs.names()]
        if self.api is not None:
            pids.append(self.api.proc.pid)
        return t.user + t.system + sum(process_cpu_or_zero(p) for p in pids if p)

    # -------------------------------------------------------------------------------- measurements
    def measure(
        self,
        tag: str,
        indices: list[int],
        *,
        env: dict[str, str] | None = None,
        playbook: Path | None = None,
        connection: str = "fleet_nsenter",
        idle_s: float = 10.0,
        prime: bool = False,
    ) -> dict[str, Any]:
        from benchmarks.fleet.hosts import (
            cgroup_cpu_s,
            cgroup_memory_bytes,
            cgroup_processes_cpu,
            cgroup_wakeups,
            daemons_cpu_s,
        )

        names = [inv.host_name(i) for i in indices]
        invdir = self.inventory_dir(tag, indices, connection)
        playbook = playbook or REPO / "playbooks" / "site.yml"
        if prime:  # e.g. fill the fact cache: the measured run is the second one
            say(f"{tag}: priming run")
            self.ansible(playbook, invdir, f"{tag}-prime", env=env)
        time.sleep(2.0)
        c0, w0, t0 = cgroup_cpu_s(), cgroup_wakeups(), time.monotonic()
        time.sleep(idle_s)
        idle_s_taken = time.monotonic() - t0
        idle_rate = ((cgroup_cpu_s() or 0.0) - (c0 or 0.0)) / idle_s_taken
        idle_wakeups = (cgroup_wakeups() - w0) / idle_s_taken  # the agents' own figure, not the machine's
        cpu0, sys0, own0 = cgroup_cpu_s(), _system_cpu(), self.helpers_cpu()
        daemons0 = cgroup_processes_cpu()
        say(f"{tag}: ansible-playbook site.yml over {len(names)} hosts (agents idle {idle_rate:.3f} CPU, "
            f"{idle_wakeups:.0f} wakeups/s)")
        r = self.ansible(playbook, invdir, tag, env=env, sliced=bool(self.args.slices))
        host_cpu = (cgroup_cpu_s() or 0.0) - (cpu0 or 0.0)
        daemons = daemons_cpu_s(daemons0, cgroup_processes_cpu())  # the agents & co. during the run
        system_cpu = _system_cpu() - sys0
        helpers = self.helpers_cpu() - own0
        doc = r.pop("account")
        processes = doc.pop("processes", {})
        stats = doc.get("stats", {})
        changed = sum(s.get("changed", 0) for h, s in stats.items() if h in names)
        failed = sum(s.get("failures", 0) + s.get("unreachable", 0) for s in stats.values())
        per_host = model.host_tasks(doc, names)
        tasks = sum(per_host.values())
        cpu = model.cpu_split(doc, host_cpu, daemons, nested=connection == "fleet_nsenter")
        background = max(0.0, host_cpu - cpu["host_s"])  # the daemons' share of the hosts' cgroup
        foreign = model.foreign_cpu_s(system_cpu, cpu, background, helpers)
        plan_a, plan_b = model.play_window(doc, model.plan_play(doc))
        runs = model.module_runs(doc, names)
        row = {
            "tag": tag,
            "hosts": len(names),
            "rc": r["rc"],
            "wall_s": r["wall_s"],
            "changed": changed,
            "failed": failed,
            "host_tasks": tasks,
            "tasks_per_host": tasks / max(1, len(names)),
            "tasks_per_host_min": min(per_host.values(), default=0),
            "tasks_per_host_max": max(per_host.values(), default=0),
            "s_per_host_task": r["wall_s"] / max(1, tasks),
            "module_runs_per_host": sum(runs.values()) / max(1, len(names)),
            "status": model.status_counts(doc),
            "per_play": model.per_play_tasks(doc, names),
            "lines": r["lines"],
            "lines_per_host": r["lines"] / max(1, len(names)),
            "cpu": cpu,
            "system_cpu_s": system_cpu,
            "helpers_cpu_s": helpers,
            "foreign_cpu_s": foreign,
            "foreign_share": foreign / system_cpu if system_cpu > 0 else 0.0,
            "agents_idle_cpu": idle_rate,
            "agents_run_cpu": daemons / max(1e-9, r["wall_s"]),  # cores, measured over the run itself
            "agents_idle_wakeups_per_s": idle_wakeups,
            "plan_api": model.api_by_verb(plan_a, plan_b),
            "plan_api_agents": model.api_by_verb(plan_a, plan_b, agents=True),
            "run_api": model.api_by_verb(
                (doc.get("plays") or [{}])[0].get("api"), doc.get("end", {}).get("api")
            ),
            "plays": [{"name": p["name"], "t": p["t"]} for p in doc.get("plays", [])],
            "top_tasks": model.cost_by(doc, names, "task")[:15],
            "roles": model.cost_by(doc, names, "role"),
            "actions": model.cost_by(doc, names, "action")[:15],
            "task_walls": model.task_walls(doc)[:15],
            "memory": cgroup_memory_bytes(),
            "main_maxrss_mib": doc.get("end", {}).get("maxrss_kib", 0) / 1024,
            "host_state": doc.get("end", {}).get("host_state", {}),
            "cprofile": top_functions((env or {}).get("HAMI_FLEET_CPROFILE", "")),
            "log": r["log"],
            "env": env or {},
            "connection": connection,
            "forks": int((env or {}).get("ANSIBLE_FORKS", self.args.forks)),
            "slices": self.args.slices,
            "processes": slices.per_process(processes, names) if processes else [],
        }
        (self.run_dir / "results").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "results" / f"{tag}.json").write_text(json.dumps({**row, "account": doc}))
        say(
            f"{tag}: rc {r['rc']} wall {r['wall_s']:.1f}s, {row['tasks_per_host']:.1f} tasks/host "
            f"({row['module_runs_per_host']:.1f} module runs), changed {changed}, failed {failed}, "
            f"controller {cpu['controller_s']:.1f} CPU-s (main {cpu['main_s']:.1f}: work "
            f"{cpu['main_work_s']:.1f}, spin {cpu['main_spin_s']:.1f}, poll {cpu['main_poll_s']:.1f}; "
            f"workers {cpu['workers_s']:.1f}), hosts "
            f"{cpu['host_s']:.1f} CPU-s, the hosts' daemons {daemons:.1f} CPU-s"
        )
        for p in row["processes"]:
            say(
                f"{tag}: process {p['process']}: {p['hosts']} hosts, {p['host_tasks']} host-tasks, main "
                f"work {p['main_work_s']:.1f} CPU-s = {p['main_work_per_host_task_s'] * 1e3:.1f} ms per "
                f"host-task, wall {p['wall_s']:.0f}s"
            )
        return row

    def run(self) -> int:
        args = self.args
        sizes = sorted(args.sizes)
        biggest = max(sizes + ([args.variant_size] if args.variants else []))
        self.check_ports(biggest)
        self.check_inotify(biggest)
        for sub in ("logs", "pids"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.start_api()
        indices = list(range(1, biggest + 1))
        self.create_nodes([inv.host_name(i) for i in [GOLD, *indices]])
        say("build: gpusim, the node image, the simulated apt repo, the stand-in libvgpu.so (each cached)")
        self.build()
        gold = self.ensure_gold()
        self.results["gold"] = gold
        names = self.start_clones(gold, indices)
        for n in sizes:
            self.only_running(names, names[:n] if args.pause_others else names)
            env = {"ANSIBLE_FORKS": str(args.forks)}
            tag = f"size-{n}" + (f"-slices{args.slices}" if args.slices else "")
            self.results["sizes"].append(self.measure(tag, indices[:n], env=env))
            self.save()
        for v in args.variants:
            n = args.variant_size
            self.only_running(names, names[:n] if args.pause_others else names)  # as its baseline size ran
            env = variant_env(v, args.forks, self.run_dir)
            playbook = self.variant_playbook(v) if v in PLAYBOOK_VARIANTS else None
            row = self.measure(
                f"variant-{v}-{n}",
                indices[:n],
                env=env,
                playbook=playbook,
                connection="hami.node.podman_pipelined" if v == "podman" else "fleet_nsenter",
                prime=v == "facts-cache",
            )
            row["variant"] = v
            self.results["variants"].append(row)
            self.save()
        return 0

    def variant_playbook(self, v: str) -> Path:
        """A copy of site.yml with one thing changed, beside links to the rest of playbooks/."""
        d = self.run_dir / "playbooks"
        d.mkdir(parents=True, exist_ok=True)
        for entry in (REPO / "playbooks").iterdir():
            link = d / entry.name
            if entry.name != "site.yml" and not link.is_symlink():
                link.symlink_to(entry)
        out = d / f"site-{v}.yml"
        out.write_text(site_variant((REPO / "playbooks" / "site.yml").read_text(), v))
        return out

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)  # a check that fails first still leaves its JSON
        (self.run_dir / "fleet.json").write_text(json.dumps(self.results, indent=2, default=str))

    def cleanup(self) -> None:
        from benchmarks.fleet.hosts import Fleet

        if not self.args.keep:
            removed = Fleet(self.run_dir, self.args.base_port).remove_all()
            if removed:
                say(f"cleanup: removed {len(removed)} containers")
        self.procs.stop_all(["kubelets", "kubelets-gold"])
        if self.api is not None:
            self.api.stop()


def top_functions(path: str, n: int = 20) -> list[dict[str, Any]]:
    """The main process's costliest functions in a cProfile file (own time), or [] without one."""
    if not path or not Path(path).exists():
        return []
    import pstats

    st = pstats.Stats(path)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if fn in ("<built-in method time.sleep>", "<built-in method time.thread_time>"):
            continue  # waiting, and the account callback's own clock
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "own_s": tt, "cum_s": ct})
    return sorted(rows, key=lambda r: -r["own_s"])[:n]


def _system_cpu() -> float:
    """CPU seconds of the whole machine so far (all but idle and iowait), from /proc/stat."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    busy = sum(f) - f[3] - (f[4] if len(f) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- report
def growth_row(name: str, points: list[tuple[int, float]]) -> tuple[str, str, str, bool]:
    """A SUMMARY row judging a figure's growth between sizes against linear (``model.linear_or_better``)."""
    value = ", ".join(f"{r:.2f}x for {h:.0f}x hosts" for _, _, r, h in model.growth(points)) or "-"
    return (name, value, "linear or better", model.linear_or_better(points))


def figures(results: dict[str, Any], *, forks: int, cores: int, rtt_s: float) -> tuple[list, dict]:
    """(SUMMARY rows, the projection) from the size runs."""
    rows: list[tuple[str, str, str, bool]] = []
    sizes = [r for r in results.get("sizes", []) if r["rc"] == 0]
    if not sizes:
        return rows, {}
    pts = [(r["hosts"], r["wall_s"]) for r in sizes]
    big = max(sizes, key=lambda r: r["hosts"])
    walls = " / ".join(f"{r['wall_s']:.0f} s" for r in sizes)
    ns = "/".join(str(r["hosts"]) for r in sizes)
    steps = " -> ".join(str(r["hosts"]) for r in sizes)
    rows.append((f"converged site.yml wall at {ns} hosts", walls, "-", True))
    rows.append(growth_row(f"growth {steps} hosts", pts))
    # what a real fleet's controller pays: the wall above also carries the simulated hosts, which share its
    # cores here (their modules and daemons), a fleet's do not
    ctl = [(r["hosts"], r["cpu"]["controller_s"]) for r in sizes]
    rows.append(growth_row(f"controller CPU (main process + workers) {steps} hosts", ctl))
    shares = " / ".join(f"{r.get('foreign_share', 0.0) * 100:.1f} %" for r in sizes)
    rows.append(
        (
            "the machine's CPU spent beside the run (other jobs; sizes are comparable only when quiet)",
            shares,
            f"<= {model.FOREIGN_MAX_SHARE * 100:.0f} % each",
            model.quiet(sizes),
        )
    )
    rows.append(
        ("seconds per host-task (wall)", " / ".join(f"{r['s_per_host_task']:.3f}" for r in sizes), "-", True)
    )
    rows.append(
        ("tasks per host (all plays)", " / ".join(f"{r['tasks_per_host']:.1f}" for r in sizes), "-", True)
    )
    plan = big["plan_api"]
    per_host = {v: n / big["hosts"] for v, n in plan.items()}
    o1 = (
        all(v not in ("get",) or per_host.get(v, 0) < 0.5 for v in per_host)
        and per_host.get("list", 0) * big["hosts"] <= 10
    )
    rows.append(
        (
            f"plan play API requests per host ({big['hosts']} hosts)",
            ", ".join(f"{v} {n:.2f}" for v, n in per_host.items()) or "none",
            "O(1) LISTs, no GET per node",
            o1,
        )
    )
    changed_ok = all(r["changed"] == 0 and r["failed"] == 0 for r in sizes)
    rows.append(
        (
            "converged: changed / failed over every size",
            f"{sum(r['changed'] for r in sizes)} / {sum(r['failed'] for r in sizes)}",
            "0 / 0",
            changed_ok,
        )
    )
    xs = [r["hosts"] for r in sizes]
    ht = [r["host_tasks"] for r in sizes]
    main = [r["cpu"]["main_work_s"] / t for r, t in zip(sizes, ht, strict=False)]
    work = [r["cpu"]["workers_s"] / t for r, t in zip(sizes, ht, strict=False)]
    host = [r["cpu"]["host_s"] / t for r, t in zip(sizes, ht, strict=False)]
    rows.append(
        (
            "controller CPU per host-task: main process work / workers (ms)",
            " ; ".join(f"{m * 1e3:.0f} / {w * 1e3:.0f}" for m, w in zip(main, work, strict=False)),
            "-",
            True,
        )
    )
    rows.append(("host CPU per host-task (ms)", " / ".join(f"{h * 1e3:.0f}" for h in host), "-", True))
    fixed, _ = model.fit_linear(xs, [r["wall_s"] for r in sizes]) if len(xs) > 1 else (0.0, 0.0)
    params = model.Params(
        tasks_per_host=big["tasks_per_host"],
        main_s=model.fit_growth(xs, main),
        worker_s=model.fit_growth(xs, work),
        host_s=sum(host) / len(host),
        fixed_s=max(0.0, fixed),
    )
    proj = model.project(params, 1000, forks, cores, rtt_s)
    rows.append(
        (
            f"projected converged 1,000-node run ({forks} forks, {cores}-core controller)",
            f"{proj['total_s'] / 60:.1f} min ({proj['bound']}-bound)",
            "<= 15 min",
            proj["total_s"] <= GOALS["projected_s"],
        )
    )
    for k in (4, 8):
        ps = model.project_slices(params, 1000, k, forks, cores, rtt_s)
        rows.append(
            (
                f"projected converged 1,000-node run in {k} slices ({cores}-core controller, model.py)",
                f"{ps['total_s'] / 60:.1f} min ({ps['bound']}-bound)",
                "<= 15 min",
                ps["total_s"] <= GOALS["projected_s"],
            )
        )
    return rows, {"params": params.__dict__, "projection": proj}


def report(results: dict[str, Any], forks: int, cores: int, rtt_s: float) -> None:
    sizes = results.get("sizes", [])
    if sizes:
        print("\nConverged site.yml over SIMULATED light hosts (fleet_nsenter connection)")
        print(
            "CPU seconds over the run: main = the controller's main process (work + spin + poll), workers = "
            "its forked workers, hosts = the modules on the hosts (cgroup, less what the processes alive "
            "before and after the run used: the agents, systemd, journald)"
        )
        print(
            f"{'hosts':>5} {'forks':>5} {'rc':>3} {'wall s':>7} {'tasks/h':>7} {'mods/h':>6} {'s/h-task':>8} "
            f"{'main':>6} {'(work':>6} {'spin':>5} {'poll)':>5} {'workers':>7} {'hosts':>7} {'machine':>7} "
            f"{'lines/h':>7}  plan-play API per host"
        )
        for r in sizes:
            c = r["cpu"]
            api = ", ".join(f"{v} {n / r['hosts']:.2f}" for v, n in r["plan_api"].items()) or "-"
            print(
                f"{r['hosts']:>5} {r.get('forks', '-'):>5} {r['rc']:>3} {r['wall_s']:>7.1f} "
                f"{r['tasks_per_host']:>7.1f} {r.get('module_runs_per_host', 0):>6.1f} "
                f"{r['s_per_host_task']:>8.4f} {c['main_s']:>6.1f} {c.get('main_work_s', 0):>6.1f} "
                f"{c.get('main_spin_s', 0):>5.1f} {c.get('main_poll_s', 0):>5.1f} {c['workers_s']:>7.1f} "
                f"{c['host_s']:>7.1f} {r['system_cpu_s']:>7.1f} {r['lines_per_host']:>7.1f}  {api}"
            )
        for r in sizes:
            for p in r.get("processes", []):
                print(
                    f"  {r['hosts']} hosts in {r['slices']} slice(s), process {p['process']}: {p['hosts']} "
                    f"hosts, main work {p['main_work_per_host_task_s'] * 1e3:.1f} ms per host-task, wall "
                    f"{p['wall_s']:.0f}s"
                )
        for r in sizes:  # the hosts' daemons share the controller's cores here, not on a fleet
            if "agents_run_cpu" in r:
                print(
                    f"  {r['hosts']} hosts: the hosts' daemons took {r['agents_run_cpu']:.3f} cores during "
                    f"the run ({r['agents_idle_cpu']:.3f} in the idle window before it, "
                    f"{r.get('agents_idle_wakeups_per_s', 0):.0f} wakeups/s)"
                )
        big = max(sizes, key=lambda r: r["hosts"])
        print(f"\nWhere a converged run's host-seconds go ({big['hosts']} hosts), by role:")
        for row in big["roles"][:10]:
            print(f"  {row['host_s']:8.1f} host-s {row['results']:6d} results  {row['name']}")
        print("by task:")
        for row in big["top_tasks"][:12]:
            print(
                f"  {row['host_s']:8.1f} host-s {row['results']:6d} results  {row['name']} ({row['action']})"
            )
        # the controller's memory: every worker is a fork of the main process, so the state kept per host
        # makes each host-task dearer as hosts are added (docs/performance.md, "What grows with the hosts")
        for r in sizes:
            st = r.get("host_state") or {}
            largest = list((st.get("top_per_host") or {}).items())[:6]
            top = ", ".join(f"{k} {v / 1024:.1f}" for k, v in largest) or "-"
            print(
                f"controller at {r['hosts']} hosts: main process max RSS "
                f"{r.get('main_maxrss_mib', 0):.0f} MiB; kept per host "
                f"{st.get('bytes_per_host', 0) / 1024:.1f} KiB pickled (largest, KiB: {top})"
            )
    variants = results.get("variants", [])
    if variants:
        base = {r["hosts"]: r for r in sizes}
        print("\nVariants (each one run; baseline = the size run with the same hosts)")
        for r in variants:
            b = base.get(r["hosts"])
            gain = f"base {b['wall_s']:.1f}s, {(r['wall_s'] / b['wall_s'] - 1) * 100:+.0f} %" if b else "-"
            print(
                f"  {r['variant']:<14} {r['hosts']:>4} hosts rc {r['rc']} wall {r['wall_s']:7.1f}s ({gain}), "
                f"controller {r['cpu']['controller_s']:.1f} CPU-s, tasks/host {r['tasks_per_host']:.1f}, "
                f"changed {r['changed']}"
            )
            c, bc = r["cpu"], (b or {}).get("cpu", {})
            print(
                f"  {'':<14} main work {c['main_work_s']:.1f} (base {bc.get('main_work_s', 0):.1f}), spin "
                f"{c['main_spin_s']:.1f}, poll {c['main_poll_s']:.1f}, workers {c['workers_s']:.1f} "
                f"({bc.get('workers_s', 0):.1f}), hosts {c['host_s']:.1f} ({bc.get('host_s', 0):.1f}) CPU-s"
            )
            for f in r.get("cprofile", [])[:12]:
                print(
                    f"      {f['own_s']:7.2f} s own {f['cum_s']:7.2f} s cum {f['calls']:>8} calls  "
                    f"{f['function']}"
                )
    rows, proj = figures(results, forks=forks, cores=cores, rtt_s=rtt_s)
    if proj:
        p = proj["projection"]
        print(
            f"\nProjection (model.py): {p['nodes']} nodes, {p['forks']} forks, {p['cores']} cores: "
            f"{p['total_s'] / 60:.1f} min = fixed {p['fixed_s']:.0f}s + max(main {p['main_s']:.0f}s, workers "
            f"{p['workers_s']:.0f}s, slots {p['slots_s']:.0f}s) + barrier {p['barrier_s']:.0f}s"
        )
    r = results.get("roll") or {}
    if r and "missing" not in r:
        print(
            f"\nSimulated roll (roll.py): {r['rolled']} of {r['config']['nodes']} nodes in "
            f"{r['hours']:.2f} h, batches {r['batch_sizes']}, {r['passes']} passes ({r['site_runs']} "
            f"site.yml run(s)); bounds {r['max_unavailable_gpus']} GPUs, {r['max_per_domain']} per domain; "
            f"peak {r['peak']}; longest drain {r['drain_max_s']:.0f} s; violations {r['violations']} "
            f"{r['first_violations']}"
        )
    elif r:
        print(f"\nSimulated roll: {r['missing']}")
    rows += roll_rows(r)
    SUMMARY[:] = rows
    for name, value, goal, ok in rows:
        print(f"{'ok ' if ok else 'MISS'} {name}: {value} (goal {goal})")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks fleet",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs root and podman; wrap it in `flock /work/podman.lock` on a shared "
        "machine. Figures: docs/performance.md, 'Fleet'.",
    )
    p.add_argument("--quick", action="store_true", help="3 and 6 hosts, no variants (smoke run, ~10 min)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[25, 50, 100])
    p.add_argument(
        "--variants",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help=f"comma-separated, from {', '.join(VARIANTS)}, or 'all'",
    )
    p.add_argument("--variant-size", type=int, default=25)
    p.add_argument(
        "--forks",
        type=int,
        default=None,
        help="forks of the size series and the variants' "
        "baseline (default: the repository's ansible.cfg, else Ansible's 5)",
    )
    p.add_argument("--run-dir", default=str(DEFAULT_RUN_DIR))
    p.add_argument(
        "--base-port", type=int, default=27000, help="host i's agents listen on BASE+2i, BASE+2i+1"
    )
    p.add_argument("--api-port", type=int, default=26443)
    p.add_argument("--run-timeout", type=float, default=5400.0, help="seconds per ansible-playbook run")
    p.add_argument("--rebuild-gold", action="store_true", help="converge a new golden node even if cached")
    p.add_argument("--keep", action="store_true", help="leave the containers running at the end")
    p.add_argument(
        "--pause-others",
        action="store_true",
        help="pause the hosts outside each size during its run (as before 2026-11-29); by default every "
        "host runs for every size, so the sizes share one background and the growth is the run's own",
    )
    p.add_argument("--controller-cores", type=int, default=8, help="for the projection (default 8)")
    p.add_argument(
        "--rtt",
        type=float,
        default=0.01,
        help="connection round trip per host-task on a real "
        "network, for the projection (default 0.01 s: ssh with ControlPersist)",
    )
    p.add_argument(
        "--report", metavar="FLEET_JSON", help="only print the report of an earlier run's fleet.json"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--slices",
        type=int,
        default=0,
        help="run site.yml through tools/site_slices.py in N slices (default 0: one ansible-playbook)",
    )
    goals.add_flag(p)
    g = p.add_argument_group("the simulated roll (no podman; needs plugins/module_utils/_rollout.py)")
    g.add_argument("--roll-only", action="store_true", help="only the simulated roll")
    g.add_argument("--no-roll", action="store_true", help="skip the simulated roll")
    g.add_argument("--roll-nodes", type=int, default=1000)
    g.add_argument("--roll-window", type=float, default=10.0, help="minutes per node's window (default 10)")
    g.add_argument("--roll-max-unavailable", default="10%", help="of the fleet's GPUs (default 10%%)")
    g.add_argument("--roll-serial", default="10%", help="nodes per batch (default 10%%)")
    g.add_argument(
        "--roll-max-per-domain",
        type=int,
        default=None,
        help="nodes out per failure domain (default: max unavailable spread over the domains; 0: none)",
    )
    g.add_argument("--roll-jitter", type=float, default=0.0, help="windows vary by +- this share (default 0)")
    g.add_argument(
        "--roll-held-back",
        choices=("later", "next"),
        default="later",
        help="where admit's held-back nodes go: a later pass (site.yml) or the next batch",
    )
    g.add_argument(
        "--roll-order",
        choices=("planner", "inventory", "budgets"),
        default="planner",
        help="the roll's order: the planner's (site.yml), its first-fit in inventory order, or roll.py's "
        "spread_by_budget then first-fit (default planner)",
    )
    g.add_argument("--roll-budget-wait", type=float, default=120.0,
                   help="site_rollout_budget_wait, seconds (default 120, site.yml's)")
    g.add_argument("--roll-domains", type=int, default=20)
    g.add_argument("--roll-seed", type=int, default=26)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = [3, 6]
        args.variants = []
    if args.forks is None:
        args.forks = documented_forks()
    if args.variants == ["all"]:
        args.variants = [v for v in VARIANTS if v not in UNSAFE_VARIANTS]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    return args


def run_roll(args: argparse.Namespace) -> dict[str, Any]:
    """The simulated 1,000-node roll (roll.py), or why it could not run."""
    from benchmarks.fleet import roll

    cfg = roll.Config(
        nodes=args.roll_nodes,
        window_s=args.roll_window * 60.0,
        serial=args.roll_serial,
        max_unavailable=args.roll_max_unavailable,
        max_per_domain=args.roll_max_per_domain,
        domains=args.roll_domains,
        seed=args.roll_seed,
        window_jitter=args.roll_jitter,
        held_back=args.roll_held_back,
        order=args.roll_order,
        budget_wait_s=args.roll_budget_wait,
    )
    try:
        planner = roll.load_planner()
    except roll.PlannerMissing as exc:
        # TODO(issue 26, item 3c): the roll planner lands with the lead's site.yml restructuring; until
        # plugins/module_utils/_rollout.py is on main this part reports that it waits for it
        return {"missing": str(exc)}
    say(
        f"roll: SIMULATED {cfg.nodes}-node driver roll, windows {args.roll_window:g} min, max unavailable "
        f"{cfg.max_unavailable} of the GPUs, serial {cfg.serial}"
    )
    t0 = time.monotonic()
    result = roll.simulate(cfg, planner)
    result["compute_s"] = time.monotonic() - t0
    return result


def roll_rows(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    goal = f"<= {GOALS['roll_h']} h, 0 violations"
    if not r:
        return []
    if "missing" in r:
        return [
            ("simulated 1,000-node roll", "TODO: waits for plugins/module_utils/_rollout.py", goal, False)
        ]
    c = r["config"]
    done = r["left"] == 0
    value = (
        f"{r['hours']:.2f} h, {r['batches']} batches, {r['site_runs']} run(s), {r['violations']} violations"
    )
    value += "" if done else f", {r['left']} nodes left"
    name = f"simulated {c['nodes']}-node roll ({c['max_unavailable']} unavailable, {c['window_s'] / 60:g}-min"
    name += " windows)"
    ok = done and r["hours"] <= GOALS["roll_h"] and r["violations"] == 0 and r["site_runs"] == 1
    return [(name, value, goal + ", one site.yml run", ok)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    forks = args.forks
    if args.report:
        results = json.loads(Path(args.report).read_text())
        report(results, forks, args.controller_cores, args.rtt)
        return goals.exit_code(SUMMARY, args.no_goals)
    if args.roll_only:
        results = {"roll": run_roll(args)}
        report(results, forks, args.controller_cores, args.rtt)
        if args.json:
            print(json.dumps({"figures": SUMMARY, **results}, indent=2, default=str))
        return goals.exit_code(SUMMARY, args.no_goals)
    if os.geteuid() != 0 or shutil.which("podman") is None:
        print("fleet: needs root and podman (the hosts are podman containers)", file=sys.stderr)
        return 2
    bench = Bench(args)

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    rc = 1
    try:
        rc = bench.run()
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
    finally:
        try:
            bench.cleanup()
        finally:
            signal.signal(signal.SIGTERM, old)
            bench.save()
    if not args.no_roll:
        bench.results["roll"] = run_roll(args)
        bench.save()
    report(bench.results, forks, args.controller_cores, args.rtt)
    if args.json:
        print(json.dumps({"figures": SUMMARY, **bench.results}, indent=2, default=str))
    return rc or goals.exit_code(SUMMARY, args.no_goals)


if __name__ == "__main__":
    raise SystemExit(main())
