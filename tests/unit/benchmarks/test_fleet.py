"""benchmarks/fleet without podman: the inventory it writes, the account arithmetic, the projection, the
site.yml variants and the command line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from benchmarks.fleet import bench, inventory, model
from benchmarks.fleet.kubelets import parse_nodes

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------------------- inventory
def test_every_host_has_its_own_agent_ports_and_name_order_is_inventory_order(tmp_path: Path) -> None:
    inv = inventory.inventory(list(range(1, 101)), 27000, connection="fleet_nsenter")
    hosts = inv["all"]["children"]["gpu_nodes"]["hosts"]
    assert list(hosts) == sorted(hosts) and len(hosts) == 100
    assert list(hosts)[:2] == ["fleet-0001", "fleet-0002"]
    binds = [
        (v["hami_agent_device_plugin_metrics_bind"], v["hami_agent_monitor_metrics_bind"])
        for v in hosts.values()
    ]
    ports = [int(b.rsplit(":", 1)[1]) for pair in binds for b in pair]
    assert len(set(ports)) == len(ports) == 200
    assert hosts["fleet-0001"]["hami_agent_device_plugin_metrics_bind"] == "127.0.0.1:27002"
    assert hosts["fleet-0001"]["hami_agent_metrics_port"] == 27002
    assert hosts["fleet-0001"]["hami_agent_monitor_metrics_bind"] == "127.0.0.1:27003"
    assert set(inventory.port_range(100, 27000)) >= set(ports) | {27000, 27001}  # the golden host's too
    assert inv["all"]["children"]["gpu_nodes"]["vars"]["ansible_connection"] == "fleet_nsenter"
    assert inv["all"]["children"]["hami_scheduler"] == {"hosts": {}}


def test_group_vars_are_the_sandbox_s_with_the_fleet_s_paths(tmp_path: Path) -> None:
    sandbox = yaml.safe_load(inventory.SANDBOX_GROUP_VARS.read_text())
    gv = inventory.group_vars(tmp_path, tmp_path / "kubeconfig")
    assert gv["sandbox_kubeconfig"] == str(tmp_path / "kubeconfig")
    assert gv["sandbox_dir"] == str(tmp_path)
    assert gv["hami_agent_build_dir"] == str(tmp_path / "wheelhouse")  # not the shared ~/.cache
    assert gv["sandbox_identities"] is False
    for key in ("nvidia_driver_reboot_method", "hami_core_artifact_path", "node_maintenance_kubeconfig"):
        assert gv[key] == sandbox[key]
    d = inventory.write(tmp_path / "inv", inventory.inventory([1], 27000, connection="c"), gv)
    assert yaml.safe_load((d / "hosts.yml").read_text())["all"]["children"]["gpu_nodes"]["hosts"][
        "fleet-0001"
    ]
    assert yaml.safe_load((d / "group_vars" / "all.yml").read_text()) == gv


def test_kubelet_node_lists_parse_in_both_forms() -> None:
    assert parse_nodes("a=/x,b=/y") == [("a", "/x"), ("b", "/y")]
    assert parse_nodes("a /x\n\nb /y z\n") == [("a", "/x"), ("b", "/y z")]


# ------------------------------------------------------------------------------------------- arithmetic
def test_fit_and_growth() -> None:
    assert model.fit_linear([25, 50, 100], [10, 20, 40]) == pytest.approx((0.0, 0.4))
    assert model.fit_linear([25], [3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError):
        model.fit_linear([], [])
    assert model.fit_growth([25, 50, 100], [0.012, 0.011, 0.010]) == pytest.approx((0.011, 0.0))  # not down
    assert model.fit_growth([25, 50], [0.01, 0.02]) == pytest.approx((0.0, 0.0004))
    g = model.growth([(50, 20.0), (25, 10.0), (100, 45.0)])
    assert [(a, b) for a, b, _, _ in g] == [(25, 50), (50, 100)]
    assert g[0][2:] == (2.0, 2.0) and g[1][2] == pytest.approx(2.25)
    assert model.linear_or_better([(25, 10.0), (50, 20.0), (100, 38.0)])
    assert not model.linear_or_better([(25, 10.0), (50, 20.0), (100, 45.0)])  # 2.25x > 2x (+10 %)


def test_projection_formula() -> None:
    # 100 tasks/host, main 2 ms, workers 40 ms, hosts 100 ms per host-task, 30 s fixed, 10 ms round trip
    p = model.Params(tasks_per_host=100, main_s=(0.002, 0.0), worker_s=(0.04, 0.0), host_s=0.1, fixed_s=30)
    r = model.project(p, 1000, forks=50, cores=8)
    ht = 100 * 1000
    assert r["main_s"] == pytest.approx(0.002 * ht)  # 200 s on one core
    assert r["workers_s"] == pytest.approx(0.04 * ht / 7)  # 571 s on 7 cores
    assert r["slots_s"] == pytest.approx((0.04 + 0.1 + 0.01) * ht / 50)  # 300 s
    assert r["barrier_s"] == pytest.approx(100 * 0.15)
    assert r["bound"] == "workers"
    assert r["total_s"] == pytest.approx(30 + 0.04 * ht / 7 + 15)
    # 5 forks: each host-task holds a slot 150 ms, 5 at a time
    assert model.project(p, 1000, forks=5, cores=8)["bound"] == "slots"
    # a main process whose cost per host-task grows with the fleet (hostvars loops) makes the run quadratic
    q = model.Params(tasks_per_host=100, main_s=(0.002, 0.00002), worker_s=(0.0, 0.0), host_s=0.0, fixed_s=0)
    assert model.project(q, 1000, 1000, 8)["main_s"] == pytest.approx((0.002 + 0.02) * ht)
    with pytest.raises(ValueError):
        model.project(p, 1000, forks=0, cores=8)


ACCOUNT = {
    "plays": [
        {
            "name": "Plan what would change",
            "t": 0.0,
            "api": {
                "rows": [
                    {
                        "agent": "OpenAPI-Generator/33.1.0/python",
                        "user": "admin",
                        "verb": "get",
                        "requests": 2,
                    },
                    {
                        "agent": "hami-agent/0.1 (linux/amd64) device-plugin",
                        "user": "admin",
                        "verb": "patch",
                        "requests": 5,
                    },
                ]
            },
        },
        {
            "name": "GPU nodes without a disruptive change",
            "t": 10.0,
            "api": {
                "rows": [
                    {
                        "agent": "OpenAPI-Generator/33.1.0/python",
                        "user": "admin",
                        "verb": "get",
                        "requests": 5,
                    },
                    {
                        "agent": "OpenAPI-Generator/33.1.0/python",
                        "user": "admin",
                        "verb": "list",
                        "requests": 1,
                    },
                    {
                        "agent": "hami-agent/0.1 (linux/amd64) device-plugin",
                        "user": "admin",
                        "verb": "patch",
                        "requests": 8,
                    },
                ]
            },
        },
    ],
    "task_starts": [{"play": "p", "name": "a", "t": 0.0}, {"play": "p", "name": "b", "t": 4.0}],
    "tasks": [
        {
            "play": "p",
            "role": "r1",
            "task": "stat",
            "action": "ansible.builtin.stat",
            "host": "h1",
            "status": "ok",
            "s": 1.0,
            "items": 0,
        },
        {
            "play": "p",
            "role": "r1",
            "task": "hold",
            "action": "ansible.builtin.dpkg_selections",
            "host": "h1",
            "status": "ok",
            "s": 3.0,
            "items": 6,
        },
        {
            "play": "p",
            "role": "r1",
            "task": "fact",
            "action": "ansible.builtin.set_fact",
            "host": "h1",
            "status": "ok",
            "s": 0.1,
            "items": 0,
        },
        {
            "play": "p",
            "role": "r2",
            "task": "stat",
            "action": "ansible.builtin.stat",
            "host": "h2",
            "status": "skipped",
            "s": 0.1,
            "items": 0,
        },
        {
            "play": "p",
            "role": "",
            "task": "api",
            "action": "hami.node.k8s_node_maintenance",
            "host": "localhost",
            "status": "ok",
            "s": 0.5,
            "items": 0,
        },
    ],
    "end": {
        "t": 10.0,
        "self_s": 5.0,
        "children_s": 30.0,
        "main": {"work_s": 3.0, "spin_s": 1.5, "poll_s": 0.5},
        "api": None,
    },
}


def test_account_arithmetic() -> None:
    hosts = ["h1", "h2"]
    assert model.host_tasks(ACCOUNT, hosts) == {"h1": 3, "h2": 1}  # localhost rows are not fleet hosts
    assert model.module_runs(ACCOUNT, hosts) == {"h1": 7, "h2": 0}  # a loop item is a run; set_fact is not
    assert model.plan_play(ACCOUNT) == 0
    a, b = model.play_window(ACCOUNT, 0)
    assert model.api_by_verb(a, b) == {"get": 3, "list": 1}  # Ansible's client only
    assert model.api_by_verb(a, b, agents=True) == {"patch": 3}
    assert model.play_window(ACCOUNT, 5) == (None, None)
    top = model.cost_by(ACCOUNT, hosts, "task")
    assert top[0]["name"] == "r1 : hold" and top[0]["host_s"] == 3.0
    assert model.cost_by(ACCOUNT, hosts, "role")[0] == {
        "name": "r1",
        "host_s": pytest.approx(4.1),
        "results": 3,
        "skipped": 0,
        "action": "ansible.builtin.set_fact",
    }
    walls = model.task_walls(ACCOUNT)
    assert [w["name"] for w in walls] == ["b", "a"] and walls[0]["wall_s"] == 6.0
    cpu = model.cpu_split(ACCOUNT, host_cpu_s=22.0, background_s=2.0)
    assert cpu["host_s"] == 20.0 and cpu["workers_s"] == 10.0 and cpu["controller_s"] == 15.0
    assert (cpu["main_work_s"], cpu["main_spin_s"], cpu["main_poll_s"]) == (3.0, 1.5, 0.5)
    # podman exec: conmon and runc start the module, so the controller's children are its workers alone
    pod = model.cpu_split(ACCOUNT, host_cpu_s=22.0, background_s=2.0, nested=False)
    assert pod["workers_s"] == 30.0 and pod["host_s"] == 20.0 and pod["controller_s"] == 35.0


# ------------------------------------------------------------------------------------------- variants
SITE = """---
- name: Reach every GPU node
  hosts: gpu_nodes
  gather_facts: false
  tasks: []
- name: Plan what would change
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Plan | the node's roles
      block:
        - name: Plan | facts
          ansible.builtin.setup:
            gather_subset: ["!all", "!min", distribution]
        - name: x
          ansible.builtin.debug:
            msg: "{{ a | default('b') }}"
      rescue: []
- name: GPU nodes, all at once
  hosts: "{{ 'site_converge' if 'site_converge' in groups else 'all:!all' }}"
  gather_facts: false
  tasks: []
"""


def test_site_variants_change_one_thing_and_nothing_else() -> None:
    base = yaml.safe_load(SITE)
    every = yaml.safe_load(bench.site_variant(SITE, "gather-all"))
    setup = every[1]["tasks"][0]["block"][0]
    assert setup["ansible.builtin.setup"] == {}  # Ansible's default subset: everything
    setup["ansible.builtin.setup"] = base[1]["tasks"][0]["block"][0]["ansible.builtin.setup"]
    assert every == base
    cached = yaml.safe_load(bench.site_variant(SITE, "facts-cache"))
    assert cached[1]["tasks"][0]["block"][0]["when"] == ["ansible_facts['os_family'] is not defined"]
    free = yaml.safe_load(bench.site_variant(SITE, "free-quiet"))
    assert [p.get("strategy") for p in free] == [None, None, "free"]
    names = [t["name"] for t in bench.walk_tasks(base[1]["tasks"])]
    assert names == ["Plan | the node's roles", "Plan | facts", "x"]
    with pytest.raises(ValueError):
        bench.site_variant(SITE, "nope")
    with pytest.raises(ValueError):
        bench.site_variant("---\n- name: no plan\n  hosts: all\n  tasks: []\n", "facts-cache")


def test_the_builtin_linear_variant_changes_only_the_strategy_of_site_yml() -> None:
    real = (bench.REPO / "playbooks" / "site.yml").read_text()
    base = yaml.safe_load(real)
    builtin = yaml.safe_load(bench.site_variant(real, "linear-builtin"))
    ours = [i for i, p in enumerate(base) if "hami.node.linear_fleet" in str(p.get("strategy", ""))]
    assert len(ours) >= 4  # reach, plan, converge, account at least
    for i in ours:
        assert builtin[i].pop("strategy") == "ansible.builtin.linear"
        base[i].pop("strategy")
    assert builtin == base
    with pytest.raises(ValueError):
        bench.site_variant(SITE, "linear-builtin")  # nothing under linear_fleet: an error, not a no-op


def test_variant_environments(tmp_path: Path) -> None:
    assert bench.variant_env("forks25", 50, tmp_path) == {"ANSIBLE_FORKS": "25"}
    env = bench.variant_env("facts-cache", 50, tmp_path)
    assert env["ANSIBLE_GATHERING"] == "smart" and env["ANSIBLE_FORKS"] == "50"
    assert env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] == str(tmp_path / "facts")
    poll = bench.variant_env("poll", 50, tmp_path)
    assert "internal_poll_interval = 0.01" in Path(poll["ANSIBLE_CONFIG"]).read_text()
    cfg = bench.poll_cfg("[defaults]\nforks = 50\n[ssh_connection]\npipelining = True\n", 0.02)
    assert "forks = 50" in cfg and "pipelining = True" in cfg and "internal_poll_interval = 0.02" in cfg


def test_documented_forks_come_from_the_repository_s_ansible_cfg(tmp_path: Path) -> None:
    assert bench.documented_forks(tmp_path) == 5  # none: Ansible's default
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 50\ncallbacks_enabled = a.b.c\n")
    assert bench.documented_forks(tmp_path) == 50
    assert bench.repo_cfg(tmp_path)["callbacks_enabled"] == "a.b.c"


def test_command_line_without_podman(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    assert "--quick" in capsys.readouterr().out
    args = bench.parse_args(["--quick", "--forks", "7"])
    assert args.sizes == [3, 6] and args.variants == [] and args.forks == 7
    assert args.pause_others is False  # every size runs beside every host: one background for all sizes
    assert bench.parse_args(["--pause-others"]).pause_others is True
    every = bench.parse_args(["--variants", "all"]).variants
    assert every == [v for v in bench.VARIANTS if v != "free-quiet"]  # run_once on every host: when named
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "turbo"])


def test_figures_from_a_run() -> None:
    def row(n: int, wall: float, gets: int, ctl_ms: float = 42.0) -> dict:
        return {
            "hosts": n,
            "rc": 0,
            "wall_s": wall,
            "s_per_host_task": wall / (n * 100),
            "tasks_per_host": 100.0,
            "host_tasks": n * 100,
            "changed": 0,
            "failed": 0,
            "plan_api": {"get": gets},
            "cpu": {"main_work_s": 0.002 * n * 100, "workers_s": 0.04 * n * 100, "host_s": 0.1 * n * 100,
                    "controller_s": ctl_ms / 1000 * n * 100},
        }

    rows, proj = bench.figures(
        {"sizes": [row(25, 100, 25), row(50, 190, 50), row(100, 380, 100)]}, forks=50, cores=8, rtt_s=0.01
    )
    named = {name: (value, ok) for name, value, _, ok in rows}
    assert named["growth 25 -> 50 -> 100 hosts"][1] is True
    assert named["controller CPU (main process + workers) 25 -> 50 -> 100 hosts"] == (
        "2.00x for 2x hosts, 2.00x for 2x hosts", True)
    # the controller's own cost per host-task growing 20 % from 25 to 100 hosts is not linear
    grown, _ = bench.figures(
        {"sizes": [row(25, 100, 25), row(100, 400, 100, ctl_ms=42.0 * 1.2)]}, forks=50, cores=8, rtt_s=0.01
    )
    ctl = [r for r in grown if r[0].startswith("controller CPU (main")][0]
    assert ctl[1] == "4.80x for 4x hosts" and ctl[3] is False
    plan = [v for k, v in named.items() if k.startswith("plan play API")][0]
    assert plan == ("get 1.00", False)  # one GET per node is not O(1)
    assert proj["projection"]["nodes"] == 1000
    assert bench.figures({"sizes": []}, forks=5, cores=8, rtt_s=0.01) == ([], {})


# ------------------------------------------------------------------------------------------- the roll
class FakePlanner:
    """The roll planner's interface (plugins/module_utils/_rollout.py), reduced to the GPU bound: enough to
    drive the simulation; ``greedy`` ignores every bound (to see the checks catch it)."""

    def __init__(self, greedy: bool = False) -> None:
        self.greedy = greedy

    class Node:
        def __init__(self, name, gpus=0, domain=None, resume=False, out=False, keeps_out=False, budgets=None):
            self.name, self.gpus, self.domain, self.out, self.budgets = name, gpus, domain, out, budgets or {}

    class Fleet:
        def __init__(self, nodes, allowed=None, recovering=None):
            self.nodes = {n.name: n for n in nodes}
            self.allowed = dict(allowed or {})

        @property
        def total_gpus(self):
            return sum(n.gpus for n in self.nodes.values())

    class Bounds:
        def __init__(self, serial=1, max_unavailable=None, max_per_domain=None, canary=False):
            self.serial, self.canary = serial, canary
            self.max_unavailable, self.max_per_domain = max_unavailable, max_per_domain

        @classmethod
        def read(cls, serial, max_unavailable, max_per_domain, canary, roll_size, fleet):
            return cls(1, FakePlanner.resolve(max_unavailable, fleet.total_gpus, "x"), max_per_domain)

    @staticmethod
    def resolve(value, total, name, minimum=0):
        v = str(value)
        return int(total * float(v[:-1]) / 100) if v.endswith("%") else int(v)

    def _fits(self, batch, node, bounds, fleet):
        if self.greedy:
            return True
        out = sum(n.gpus for n in fleet.nodes.values() if n.out) + sum(n.gpus for n in batch) + node.gpus
        used = {}
        for n in batch:
            for b in n.budgets:
                used[b] = used.get(b, 0) + 1
        budgets_ok = all(used.get(b, 0) + 1 <= fleet.allowed.get(b, 0) for b in node.budgets)
        return out <= bounds.max_unavailable and budgets_ok

    def plan(self, nodes, bounds, fleet, leave_last=0):
        batches, pending = [], list(nodes)
        while pending:
            batch = []
            for n in pending:
                if self._fits(batch, n, bounds, fleet):
                    batch.append(n)
            if not batch:
                break
            batches.append([n.name for n in batch])
            pending = [n for n in pending if n not in batch]
        return type("Plan", (), {"batches": batches, "deferred": {n.name: "no room" for n in pending}})()

    def admit(self, members, bounds, fleet):
        go, wait = [], {}
        for n in members:
            if self._fits(go, n, bounds, fleet):
                go.append(n)
            else:
                wait[n.name] = "later"
        return [n.name for n in go], wait


def test_the_simulated_roll_keeps_every_bound_with_a_planner_that_does() -> None:
    from benchmarks.fleet import roll

    cfg = roll.Config(nodes=100, domains=5, window_s=300, max_per_domain=100, canary=False, out_nodes=2)
    r = roll.simulate(cfg, FakePlanner())
    assert r["left"] == 0 and r["rolled"] == 98  # the operator's two cordons stay out of it
    assert r["violations"] == 0
    assert r["peak"]["gpus_out"] <= r["max_unavailable_gpus"] == 80
    assert r["peak"]["budget_margin"] >= 0  # evictions waited for their budgets
    assert r["batches"] >= 10 and 0.5 < r["hours"] < 6
    assert roll.simulate(cfg, FakePlanner())["hours"] == r["hours"]  # deterministic for a seed


def test_the_simulated_roll_counts_a_planner_that_breaks_the_bounds() -> None:
    from benchmarks.fleet import roll

    cfg = roll.Config(nodes=60, domains=3, window_s=120, max_per_domain=2, canary=False, out_nodes=0)
    r = roll.simulate(cfg, FakePlanner(greedy=True))
    kinds = {v["what"] for v in r["first_violations"]}
    assert r["violations"] >= 2 and {"gpus", "domain"} <= kinds
    # budgets hold whatever the planner does: the Eviction API refuses what they do not allow
    assert r["peak"]["budget_margin"] >= 0


def test_the_roll_waits_for_the_planner_when_it_is_missing(tmp_path: Path) -> None:
    from benchmarks.fleet import roll

    with pytest.raises(roll.PlannerMissing):
        roll.load_planner(tmp_path / "_rollout.py")
    rows = bench.roll_rows({"missing": "not yet"})
    assert rows[0][3] is False and "TODO" in rows[0][1]


def test_the_simulated_admit_waits_like_k8s_rollout() -> None:
    """roll.py's admit is k8s_rollout's: answer at once unless waiting may let more go (nobody fits, or
    admit_soon names members); poll with backoff 2, 4, 8, 16, 30 s up to the wait."""
    from benchmarks.fleet import roll

    c = roll.build(roll.Config(nodes=10, domains=2, out_nodes=0))
    real = roll.load_planner()
    polls: list[float] = []

    def planner(go: list[str], soon: list[str]) -> Any:
        def admit(view, bounds, fleet):
            polls.append(c.now)
            return go, {n.name: "budget" for n in view if n.name not in go}

        return SimpleNamespace(Node=real.Node, Fleet=real.Fleet, admit=admit, admit_soon=lambda *a: soon)

    members = ["gpu-0000", "gpu-0001"]
    bounds = real.Bounds(serial=2)
    go, wait = roll.admit_like_k8s_rollout(c, planner(["gpu-0000"], []), members, bounds, 120.0, c.tick)
    assert (go, list(wait), polls) == (["gpu-0000"], ["gpu-0001"], [0.0])  # nothing to wait for
    polls.clear()
    roll.admit_like_k8s_rollout(c, planner(["gpu-0000"], ["gpu-0001"]), members, bounds, 120.0, c.tick)
    assert polls == [0.0, 2.0, 6.0, 14.0, 30.0, 60.0, 90.0, 120.0]  # a replacement on its way: bounded
    polls.clear()
    start = c.now
    go, _ = roll.admit_like_k8s_rollout(c, planner([], []), members, bounds, 10.0, c.tick)
    assert go == [] and [p - start for p in polls] == [0.0, 2.0, 6.0]  # nobody fits: wait, then hand on


def test_the_simulated_roll_with_the_real_planner_keeps_every_bound() -> None:
    from benchmarks.fleet import roll

    cfg = roll.Config(nodes=200, domains=5, out_nodes=2, window_s=300)
    r = roll.simulate(cfg)
    assert r["left"] == 0 and r["violations"] == 0
    assert r["peak"]["gpus_out"] <= r["max_unavailable_gpus"]
    assert r["peak"]["per_domain"] <= r["max_per_domain"]
    assert r["passes"] >= 2 and r["site_runs"] == 1  # pass 1 left its last batches to pass 2
    assert r["per_batch"][0]["nodes"] == 1  # the canary; pass 2 has none
    assert all(b["nodes"] > 1 for b in r["per_batch"] if b["pass"] == 2)


def test_a_batch_longer_than_the_stall_limit_is_not_a_stall() -> None:
    from benchmarks.fleet import roll

    # 20-min windows: each batch outlasts stall_s (15 min); the roll used to end after its canary
    cfg = roll.Config(nodes=60, domains=3, out_nodes=0, window_s=1200, serial="50%", max_unavailable="50%")
    r = roll.simulate(cfg)
    assert r["left"] == 0 and r["violations"] == 0 and r["batches"] >= 3


def _bench_callback():
    import importlib.util

    path = Path(bench.__file__).parent / "callback_plugins" / "fleet_bench_account.py"
    spec = importlib.util.spec_from_file_location("fleet_bench_account_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_host_state_bytes_names_the_largest_variables_per_host() -> None:
    cb = _bench_callback()
    packages = {f"pkg{i}": [{"name": f"pkg{i}", "version": "1.0-1"}] for i in range(300)}
    vm = SimpleNamespace(
        _fact_cache={"h1": {"packages": packages}, "h2": {"packages": packages, "os_family": "Debian"}},
        _nonpersistent_fact_cache={"h1": {"small": 1}, "h3": {"small": 2}},
    )
    state = cb._host_state_bytes(vm)
    assert state["hosts"] == 3
    first = next(iter(state["top_per_host"]))
    assert first == "facts:packages"  # the largest comes first
    assert state["top_per_host"]["facts:packages"] > 100 * state["top_per_host"]["vars:small"]
    assert state["bytes_per_host"] == pytest.approx(sum(state["top_per_host"].values()), abs=3)
    assert cb._host_state_bytes(None) == {}


def test_growth_playbook_keeps_a_fact_only_when_asked() -> None:
    from benchmarks.fleet import growth

    plain = yaml.safe_load(growth.playbook(5, kept=False))[0]["tasks"]
    kept = yaml.safe_load(growth.playbook(5, kept=True))[0]["tasks"]
    assert len(plain) == 5 and all("ansible.builtin.debug" in t for t in plain)
    assert len(kept) == 6 and "kept" in kept[0]["ansible.builtin.set_fact"]
    assert (
        growth.median_row(
            [
                {
                    "hosts": 1,
                    "kept": True,
                    "host_tasks": 3,
                    "work_ms": w,
                    "fork_ms": 1.0,
                    "workers_ms": 2.0,
                    "rss_mib": 50.0,
                    "kept_kib": 15.0,
                    "wall_s": 10.0 * w,
                }
                for w in (3.0, 1.0, 2.0)
            ]
        )["work_ms"]
        == 2.0
    )
    assert growth.KEPT["yes"] == (True,) and growth.KEPT["both"] == (False, True)


def test_the_collection_link_follows_this_checkout(tmp_path: Path) -> None:
    fake = SimpleNamespace(run_dir=tmp_path)
    link = tmp_path / "collections" / "ansible_collections" / "hami" / "node"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "a-removed-worktree")  # a run dir made by another checkout
    assert bench.Bench.collections(fake) == tmp_path / "collections"
    assert link.resolve() == bench.REPO
    bench.Bench.collections(fake)  # idempotent
    assert link.resolve() == bench.REPO



def test_each_clone_gets_gpu_and_mig_uuids_of_its_own(tmp_path):
    """The golden node's gpusim state is copied to every clone; without personalize_gpusim all clones
    would report the same GPU and MIG UUIDs, which no real fleet does."""
    import json

    from benchmarks.fleet.hosts import Fleet
    from tests.gpusim import gpusim_state as gs

    fleet = Fleet(tmp_path, 20000)
    uuids = {}
    for name in ("fleet-0001", "fleet-0002"):
        d = fleet.gpusim_dir(name)
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps(gs.load_profile("h20-mig-mixed")))
        fleet.personalize_gpusim(name)
        doc = json.loads((d / "state.json").read_text())
        gs.validate(doc)
        uuids[name] = {g["uuid"] for g in doc["gpus"]} | {
            m["uuid"] for g in doc["gpus"] for m in (g.get("mig") or {}).get("devices") or []}
    assert len(uuids["fleet-0001"]) == 8 + 12
    assert not uuids["fleet-0001"] & uuids["fleet-0002"]


def test_a_size_run_beside_other_work_is_flagged() -> None:
    cpu = {"controller_s": 140.0, "host_s": 445.0}
    # the machine's busy time less the run's own parts: controller, modules, idle agents, helpers
    assert model.foreign_cpu_s(607.0, cpu, 8.0, 12.0) == pytest.approx(2.0)
    assert model.foreign_cpu_s(500.0, cpu, 8.0, 12.0) == 0.0  # clock granularity never goes negative

    def row(n: int, share: float | None) -> dict:
        r = {"hosts": n, "rc": 0, "wall_s": 4.0 * n, "s_per_host_task": 0.04, "tasks_per_host": 100.0,
             "host_tasks": n * 100, "changed": 0, "failed": 0, "plan_api": {},
             "cpu": {"main_work_s": 0.2 * n, "workers_s": 4.0 * n, "host_s": 10.0 * n,
                     "controller_s": 4.2 * n}}
        if share is not None:
            r["foreign_share"] = share
        return r

    def check(*sizes: dict) -> tuple[str, bool]:
        rows, _ = bench.figures({"sizes": list(sizes)}, forks=50, cores=8, rtt_s=0.01)
        return next((v, ok) for name, v, _, ok in rows if name.startswith("the machine's CPU spent beside"))

    assert check(row(25, 0.01), row(100, 0.02)) == ("1.0 % / 2.0 %", True)
    assert check(row(25, 0.10), row(100, 0.02)) == ("10.0 % / 2.0 %", False)  # 25 hosts beside tests
    assert check(row(25, None), row(100, None))[1] is True  # results from before the figure existed


def test_cgroup_wakeups_add_up_every_thread_listed_under_the_parent(tmp_path: Path) -> None:
    """The hosts' wakeups come from the tasks files of every cgroup below the fleet's parent."""
    import os
    import time

    from benchmarks.fleet.hosts import cgroup_wakeups

    me = tmp_path / "cpuacct" / "hami_fleet" / "libpod-x"
    me.mkdir(parents=True)
    (me / "tasks").write_text(f"{os.getpid()}\n")
    (tmp_path / "cpuacct" / "hami_fleet" / "tasks").write_text("999999999\n")  # gone: not counted
    before = cgroup_wakeups("/hami_fleet", root=tmp_path)
    time.sleep(0.001)
    assert cgroup_wakeups("/hami_fleet", root=tmp_path) > before > 0
    assert cgroup_wakeups("/elsewhere", root=tmp_path) == 0


def test_daemons_cpu_counts_only_processes_alive_at_both_snapshots(tmp_path: Path) -> None:
    """The hosts' background during a run is what the processes alive before and after it used; a module
    that ran between the snapshots, one that ended, and a pid reused by a newer process are not in it."""
    import os

    from benchmarks.fleet.hosts import cgroup_processes_cpu, daemons_cpu_s

    me = tmp_path / "cpuacct" / "hami_fleet" / "libpod-x"
    me.mkdir(parents=True)
    (me / "cgroup.procs").write_text(f"{os.getpid()}\n999999999\n")  # the second one is gone
    snap = cgroup_processes_cpu("/hami_fleet", root=tmp_path)
    assert [pid for pid, _ in snap] == [os.getpid()]
    before = {(1, 100): 5.0, (2, 200): 1.0, (3, 300): 2.0}
    after = {(1, 100): 7.5, (2, 999): 9.0, (4, 400): 3.0}  # 2 reused by a newer process, 3 ended, 4 new
    assert daemons_cpu_s(before, after) == 2.5


def test_process_start_and_cpu_of_a_live_and_a_gone_process() -> None:
    import os

    import pytest

    from benchmarks.procstat import process_start_and_cpu_s

    start, cpu = process_start_and_cpu_s(os.getpid())
    assert start > 0 and cpu > 0
    with pytest.raises(OSError):
        process_start_and_cpu_s(999999999)
