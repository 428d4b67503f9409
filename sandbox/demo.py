"""``python -m sandbox demo``: the whole story on the SIMULATED cluster, every step checked.

a) build what is missing and start the sandbox;
b) provision with the real playbooks (``playbooks/site.yml``);
c) submit a sample workload through the API server and show where each pod landed and what each container
   received from the device plugin's Allocate (the SIMULATED kubelet records it);
d) replay seed 003: known-bad driver + mixed MIG -> NVML hangs; pods keep being admitted; ``hami-agent
   doctor`` names NVML_INIT_HANG_KNOWN_BAD_DRIVER with evidence; ``remediate_nvml_hang.yml`` fixes it;
   doctor is clean;
e) roll a driver pin change over the GPU nodes under a PodDisruptionBudget (sandbox/rollout.py): a node
   an operator cordoned stays cordoned, a node that fails its gate stays cordoned and stops the roll, the
   fixed node resumes, MIG and MPS drift on nodes with GPU pods evict them first, a second run changes
   nothing;
f) report (text, demo-output/report.html and report.json). Exit 0 only if every check passed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hami_agent.k8s.errors import KubeError
from sandbox import identities, podman, sick_node
from sandbox import rollout as ro
from sandbox.cluster import PLUGIN_UNIT, SCHEDULER_UNIT, Sandbox, SandboxError, _env, wait_for
from sandbox.config import GPUSIM_LIB, REPO
from sandbox.report import STEP_TITLES, write_html, write_json
from sandbox.report_metrics import panels_html
from sandbox.workload import NAMESPACE, replay_workload, sample_workload

SEED_NODE = "gpu-h20"
BAD_DRIVER = "570.158.01"
FIXED_DRIVER = "570.172.08"
SITE = REPO / "playbooks" / "site.yml"
REMEDIATE = REPO / "playbooks" / "remediate_nvml_hang.yml"
ADMIT_DEADLINE_S = 10.0  # a pod sent to the hung node must be decided within this (seed: never)


@dataclass
class Check:
    step: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Demo:
    sb: Sandbox
    out: Path
    checks: list[Check] = field(default_factory=list)
    sections: dict[str, list[str]] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    step: str = ""
    rollout: dict = field(default_factory=dict)
    fleet: dict = field(default_factory=dict)  # site.yml's per-node accounts (step b)

    # ----------------------------------------------------------------------------- output helpers
    def say(self, msg: str = "") -> None:
        print(msg, flush=True)
        self.sections.setdefault(self.step, []).append(msg)

    def header(self, step: str, title: str) -> None:
        self.step = step
        print(f"\n=== {step}) {title}  [{time.monotonic() - self.t0:5.1f}s]", flush=True)
        self.sections.setdefault(step, []).append(f"== {title}")

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(self.step, name, bool(ok), detail))
        self.say(f"  [{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))
        return bool(ok)

    def _doctor_kubeconfig(self, node: str) -> str:
        """The kubeconfig doctor uses inside a node container: an operator's (the read-only hami-doctor
        role) when every component has its own identity, since the node's own identity may read only its
        node and its pods; else the node's."""
        operator = identities.kubeconfig(self.sb.cfg.run_dir, "operator")
        if operator is None:
            return "/etc/hami/kubeconfig"
        dest = "/root/hami-doctor.kubeconfig"
        subprocess.run(["podman", "cp", str(operator), f"{node}:{dest}"], check=True, timeout=60,
                       capture_output=True)
        return dest

    def guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a broken step is a failed check, the demo goes on
            self.check(f"step {self.step} ran to the end", False, f"{type(exc).__name__}: {exc}")
            with (self.out / "errors.log").open("a") as fh:
                fh.write(traceback.format_exc() + "\n")

    # ----------------------------------------------------------------------------- helpers
    def node_exec(self, node: str, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
        return podman.exec_(node, list(argv), timeout_s=timeout_s, check=False)

    def pods(self) -> dict[str, dict]:
        client = self.sb.kube()
        try:
            return {p["metadata"]["name"]: p for p in client.list_pods(namespace=NAMESPACE)}
        finally:
            client.close()

    def admissions(self) -> dict[str, dict]:
        """The kubelet simulators' admission records of the pods that exist now, by pod name (a record
        of an earlier pod with the same name has another uid and is ignored)."""
        uids = {name: (p.get("metadata") or {}).get("uid") for name, p in self.pods().items()}
        out: dict[str, dict] = {}
        for node in self.sb.cfg.nodes:
            path = self.sb.cfg.node_dir(node.name) / "admissions.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    rec = json.loads(line)
                    name = rec["pod"].split("/", 1)[1]
                    if uids.get(name) == rec.get("uid"):
                        out[name] = rec
        return out

    def scrapes(self) -> dict[str, str]:
        """The ``/metrics`` texts of the extender and every node's device plugin ("" where down), for the
        report's dashboard picture."""
        ports = {"scheduler": self.sb.cfg.scheduler_metrics_port,
                 **{f"plugin {n.name}": n.metrics_port for n in self.sb.cfg.nodes}}
        out: dict[str, str] = {}
        for source, port in ports.items():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:  # noqa: S310
                    out[source] = r.read().decode()
            except OSError:
                out[source] = ""
        return out

    def metric(self, port: int, name: str) -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:  # noqa: S310
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def allocatable(self, node: str, res: str = "nvidia.com/gpu") -> int:
        client = self.sb.kube()
        try:
            n = client.get_node(node)
        finally:
            client.close()
        return int(((n.get("status") or {}).get("allocatable") or {}).get(res, "0"))

    def registered(self, node: str) -> bool:
        client = self.sb.kube()
        try:
            ann = (client.get_node(node).get("metadata") or {}).get("annotations") or {}
        finally:
            client.close()
        return bool(ann.get("hami.io/node-nvidia-register"))

    def doctor(self, node: str, label: str) -> tuple[int, dict]:
        """`hami-agent doctor cluster`, run where the node's agent runs (in the container, or on the host
        against the node's gpusim state and emulated sysfs)."""
        cfg = self.sb.cfg
        n = cfg.node(node)
        self.sb.write_emulated_procfs(node)
        common = [
            "doctor",
            "cluster",
            "--node-name",
            node,
            "--no-journal",
            "--nvml-timeout",
            "5",
            "--json",
            "--plugin-url",
            f"http://127.0.0.1:{n.metrics_port}",
            "--scheduler-url",
            cfg.scheduler_url,
        ]
        if self.sb.placement.plugins.get(node) == "container":
            # a container cannot fake /sys: gpusim keeps the loaded module version in /run/gpusim/sys.
            # Doctor reads the node through --host-root; give it a view of / whose sys is gpusim's.
            view = "/run/hami-hostview"
            targets = {
                "sys": "/run/gpusim/sys",
                "proc": "/run/gpusim/proc",
                **{d: f"/{d}" for d in ("usr", "etc", "var", "opt", "tmp")},
            }
            script = f"mkdir -p {view} && " + " && ".join(
                f"ln -sfn {t} {view}/{d}" for d, t in targets.items()
            )
            self.node_exec(node, "sh", "-c", script)
            argv = [
                "podman",
                "exec",
                node,
                "/opt/hami-agent/venv/bin/hami-agent",
                *common,
                "--kubeconfig",
                self._doctor_kubeconfig(node),
                "--host-root",
                view,
                "--proc-root",
                "/proc",
            ]
            env = dict(os.environ)
        else:
            argv = [
                str(Path(sys.executable).parent / "hami-agent"),
                *common,
                "--kubeconfig",
                str(cfg.kubeconfig),
                "--nvml-lib",
                str(GPUSIM_LIB),
                "--host-root",
                str(cfg.host_root(node)),
            ]
            env = {**os.environ, **_env(), "GPUSIM_STATE": str(cfg.gpusim_state(node))}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
        (self.out / f"doctor-{label}.json").write_text(proc.stdout)
        (self.out / f"doctor-{label}.cmd").write_text(" ".join(argv) + "\n" + proc.stderr)
        try:
            return proc.returncode, json.loads(proc.stdout)
        except ValueError:
            return proc.returncode, {"error": (proc.stderr or proc.stdout)[-800:]}

    def playbook(
        self, path: Path, log: str, *extra: str, limit: str | None = None, timeout_s: float = 600
    ) -> subprocess.CompletedProcess:
        self.say(
            f"  $ ansible-playbook -i inventories/sandbox {path.relative_to(REPO)}"
            + (f" -l {limit}" if limit else "")
            + (" " + " ".join(extra) if extra else "")
        )
        t = time.monotonic()
        task = [""]
        seen: set[str] = set()

        def progress(line: str) -> None:
            # show what changes (and what fails) as it happens; the full output is in the log
            if line.startswith("TASK ["):
                task[0] = line[6:].split("]", 1)[0]
            elif line.startswith(("changed:", "fatal:", "failed:")):
                host = line.split("[", 1)[1].split("]", 1)[0] if "[" in line else ""
                shown = f"    {line.split(':', 1)[0]:7} {host:12} {task[0]}"
                if shown not in seen:  # a loop reports each item: once per task and host is enough
                    seen.add(shown)
                    self.say(shown)

        proc = self.sb.ansible(path, *extra, limit=limit, timeout_s=timeout_s, log_name=log, on_line=progress)
        recap = [ln for ln in proc.stdout.splitlines() if " : ok=" in ln]
        for ln in recap:
            self.say("    " + " ".join(ln.split()))
        self.say(f"    ({time.monotonic() - t:.0f}s, log {self.sb.cfg.logs / (log + '.log')})")
        return proc

    # ----------------------------------------------------------------------------- steps
    def step_a(self) -> None:
        self.header("a", "build what is missing and start the sandbox")
        self.sb.up(agents=False)
        st = self.sb.status()
        self.check(
            "API server, node containers and SIMULATED kubelets are up",
            st["apiserver"] and all(st["containers"].values()),
            f"containers {st['containers']}",
        )
        bad = self.sb.gpusim_state(SEED_NODE)
        self.check(
            f"{SEED_NODE} starts on the seed's known-bad driver",
            bad.get("module_version") == BAD_DRIVER,
            f"loaded module {bad.get('module_version')}, MIG on GPUs "
            f"{[g['index'] for g in bad['gpus'] if g['mig']['current'] == 1]}",
        )

    def step_b(self) -> None:
        self.header("b", "provision the nodes with the real playbooks")
        if SITE.exists():
            self._provision_with_a_sick_node()
        else:
            self.check("ansible-playbook playbooks/site.yml", False, f"{SITE} is missing")
        for node in self.sb.cfg.nodes:
            st = self.sb.gpusim_state(node.name)
            self.check(
                f"{node.name}: driver {FIXED_DRIVER} installed and loaded (known-bad refused/fixed)",
                st.get("driver_version") == FIXED_DRIVER and st.get("module_version") == FIXED_DRIVER,
                f"library {st.get('driver_version')}, module {st.get('module_version')}",
            )
            mps = self.node_exec(node.name, "test", "-x", "/usr/bin/nvidia-cuda-mps-control")
            self.check(f"{node.name}: compute utils (nvidia-cuda-mps-control) installed", mps.returncode == 0)
            smi = self.node_exec(node.name, "timeout", "15", "nvidia-smi", "-L")
            self.say(
                "    "
                + "\n    ".join(smi.stdout.strip().splitlines()[:6])
                + (" ..." if smi.stdout.count("\n") > 6 else "")
            )
        h20 = self.sb.gpusim_state(SEED_NODE)
        layout = [len(g["mig"]["devices"]) if g["mig"]["current"] == 1 else 0 for g in h20["gpus"]]
        self.check(
            f"{SEED_NODE}: the seed's MIG layout (GPUs 0-2: 3g.48gb + 1g.24gb + 2x 1g.12gb)",
            layout == [4, 4, 4, 0, 0, 0, 0, 0],
            f"MIG devices per GPU {layout}",
        )
        kcfg = self.node_exec(
            SEED_NODE,
            "sh",
            "-c",
            "grep -h 'verbosity' /etc/kubernetes/kubelet-config.yaml "
            "/var/lib/kubelet/config.yaml 2>/dev/null",
        )
        self.check(
            "kubelet verbosity set (seed 003 §3.1.6)",
            "verbosity" in kcfg.stdout,
            kcfg.stdout.strip() or "no verbosity in the kubelet config",
        )
        self.check(
            "MPS configured (nvidia_mps role)",
            any(podman.unit_active(n.name, "nvidia-mps.service") for n in self.sb.cfg.nodes),
            "nvidia-mps.service active" if SITE.exists() else "NOT YET: site.yml missing",
        )
        placement = self.sb.ensure_agents()
        for node in self.sb.cfg.nodes:
            where = placement.plugins[node.name]
            self.check(
                f"{node.name}: device plugin deployed as systemd service {PLUGIN_UNIT}",
                where == "container",
                "active in the node"
                if where == "container"
                else "NOT YET: not deployed by the playbooks; the sandbox runs the same agent on the host",
            )
        self.check(
            f"scheduler extender deployed as systemd service {SCHEDULER_UNIT}",
            placement.scheduler == "container",
            "active on the control node"
            if placement.scheduler == "container"
            else "NOT YET: not deployed by the playbooks; the sandbox runs it on the host",
        )
        ok = wait_for(
            lambda: all(self.registered(n.name) and self.allocatable(n.name) > 0 for n in self.sb.cfg.nodes),
            60,
        )
        self.check(
            "every GPU node registered its GPUs (hami.io/node-nvidia-register, allocatable nvidia.com/gpu)",
            ok,
            ", ".join(f"{n.name}: {self.allocatable(n.name)}" for n in self.sb.cfg.nodes),
        )

    def _provision_with_a_sick_node(self) -> None:
        """site.yml while one node's dpkg lock is held (sandbox/sick_node.py): the others converge, the
        account names the sick node; a rerun of only the nodes that need attention finishes it."""
        sick = sick_node.SICK_NODE
        held = sick_node.hold_dpkg_lock(sick)
        self.say(f"  {sick} is sick: its dpkg lock is held (an unattended upgrade that never ends): {held}")
        first = self.out / "site-run1"
        try:
            proc = self.playbook(SITE, "site", "-e", f"site_rollout_report_dir={first}", timeout_s=2400)
        finally:
            sick_node.release_dpkg_lock(sick)
        doc = sick_node.account(first)
        self.fleet["run1"] = doc
        nodes = doc.get("nodes") or {}
        for line in [ln for ln in proc.stdout.splitlines() if ln.startswith(tuple(nodes))][-len(nodes):]:
            self.say("    " + line[:160])
        want = {n.name for n in self.sb.cfg.nodes} | {"hami-control"}
        others = {n: v["state"] for n, v in nodes.items() if n != sick}
        failed = nodes.get(sick) or {}
        self.check(
            f"one sick node never stops the others: {sick} failed in the converge play (dpkg lock held), "
            "every other node converged or rolled, the account says so and the exit code is non-zero",
            held and proc.returncode != 0 and failed.get("state") == "failed"
            and failed.get("play") == "converge" and "lock" in failed.get("detail", "").lower()
            and set(nodes) == want
            and all(state in ("changed", "converged", "rolled") for state in others.values())
            and doc.get("needs_attention") == [sick],
            f"exit {proc.returncode}; {sick}: {failed.get('task', '?')}: {failed.get('detail', '')[:160]}; "
            f"others {others}",
        )
        second = self.out / "site-run2"
        rerun = self.playbook(SITE, "site-rerun", "-e", f"site_rollout_report_dir={second}", "--limit",
                              f"@{first / '_needs-attention.txt'}", timeout_s=1200)
        doc = sick_node.account(second)
        self.fleet["run2"] = doc
        states = {n: v["state"] for n, v in (doc.get("nodes") or {}).items()}
        self.check(
            "ansible-playbook playbooks/site.yml succeeded for every node once the lock was gone: a rerun of "
            f"only the nodes that needed attention (--limit @_needs-attention.txt) converged {sick}",
            rerun.returncode == 0 and states == {sick: "changed"},
            f"exit {rerun.returncode}; account {states}",
        )
        refused = "known-bad" in proc.stdout or "known bad" in proc.stdout
        self.say(f"  site.yml output mentions the known-bad driver policy: {refused}")

    def step_c(self) -> None:
        self.header("c", "sample workload: shared vGPUs, an exclusive GPU, a MIG device, an init container")
        client = self.sb.kube()
        pods = sample_workload(SEED_NODE)
        for p in pods:
            client.create("pods", p)
        client.close()
        names = [p["metadata"]["name"] for p in pods]
        wait_for(
            lambda: all(
                self.pods()[n].get("status", {}).get("phase") in ("Running", "Failed") for n in names
            ),
            60,
        )
        live, adm = self.pods(), self.admissions()
        self.say(
            f"  {'pod':11} {'node':9} {'phase':8} {'container':8} {'resource':24} "
            "devices -> what the container got"
        )
        for n in names:
            p = live[n]
            node = p["spec"].get("nodeName") or "-"
            phase = (p.get("status") or {}).get("phase", "Pending")
            rec = adm.get(n, {})
            allocs = rec.get("allocations") or {}
            if not allocs:
                self.say(f"  {n:11} {node:9} {phase:8} {rec.get('message') or ''}")
            for ctr, per_res in allocs.items():
                for res, a in per_res.items():
                    envs = a.get("envs") or {}
                    shown = {
                        k: v
                        for k, v in envs.items()
                        if k
                        in ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")
                    }
                    mounts = [m["containerPath"] for m in a.get("mounts") or []]
                    self.say(
                        f"  {n:11} {node:9} {phase:8} {ctr:8} {res:24} {len(a['devices'])} -> {shown}"
                        + (f" mounts {mounts}" if mounts else "")
                    )
        (self.out / "workload.json").write_text(
            json.dumps({n: {"pod": live[n], "admission": adm.get(n)} for n in names}, indent=2)
        )
        for n in names:
            self.check(
                f"pod {n} Running",
                (live[n].get("status") or {}).get("phase") == "Running",
                f"on {live[n]['spec'].get('nodeName')}; {adm.get(n, {}).get('message') or ''}".strip("; "),
            )

        def env(n: str, ctr: str, res: str = "nvidia.com/gpu") -> dict:
            return (((adm.get(n) or {}).get("allocations") or {}).get(ctr) or {}).get(res, {}).get(
                "envs"
            ) or {}

        self.check(
            "shared-a got a 10240 MiB / 30% vGPU (HAMi-core limits)",
            env("shared-a", "infer").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "10240m"
            and env("shared-a", "infer").get("CUDA_DEVICE_SM_LIMIT") == "30",
        )
        self.check(
            "exclusive got a whole GPU (100% cores)",
            env("exclusive", "train").get("CUDA_DEVICE_SM_LIMIT") == "100",
        )
        mig = env("mig-3g", "infer", "nvidia.com/mig-3g.48gb").get("NVIDIA_VISIBLE_DEVICES", "")
        self.check("mig-3g got one 3g.48gb MIG device of the seed's node", mig.startswith("MIG-"), mig)
        self.check(
            "with-init: the init container and the app container both got their vGPU",
            env("with-init", "warmup").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "4096m"
            and env("with-init", "app").get("CUDA_DEVICE_MEMORY_LIMIT_0") == "8192m",
        )
        shared = [
            (live[n].get("metadata", {}).get("annotations") or {}).get("hami.io/vgpu-devices-allocated", "")
            for n in ("shared-a", "shared-b")
        ]
        self.say(f"  hami.io/vgpu-devices-allocated: shared-a={shared[0]!r} shared-b={shared[1]!r}")

    def step_d(self) -> None:
        self.header("d", "replay seed 003: known-bad driver + mixed MIG -> NVML hang")
        proc = self.playbook(
            REPO / "sandbox" / "playbooks" / "seed_driver.yml",
            "seed003-state",
            "-e",
            f"sandbox_seed_driver={BAD_DRIVER}",
            limit=SEED_NODE,
        )
        st = self.sb.gpusim_state(SEED_NODE)
        self.check(
            f"{SEED_NODE} is back on {BAD_DRIVER} with mixed MIG (the seed's state)",
            proc.returncode == 0 and st.get("module_version") == BAD_DRIVER,
            f"module {st.get('module_version')}, MIG GPUs "
            f"{[g['index'] for g in st['gpus'] if g['mig']['current']]}",
        )
        smi = self.node_exec(SEED_NODE, "timeout", "5", "nvidia-smi", "-L", timeout_s=30)
        self.check(
            "nvidia-smi hangs on the node (the seed's symptom)",
            smi.returncode == 124,
            f"`timeout 5 nvidia-smi -L` exit {smi.returncode}",
        )
        port = self.sb.cfg.node(SEED_NODE).metrics_port
        self.sb.restart_plugin(SEED_NODE)  # the seed restarted the plugin too: NVML init hangs on start
        stuck = wait_for(lambda: (self.metric(port, "hami_device_plugin_nvml_stuck") or 0) >= 1, 40)
        self.check(
            "device plugin detected the hang and kept serving (/metrics: hami_device_plugin_nvml_stuck 1)",
            stuck,
            f"hami_device_plugin_nvml_stuck={self.metric(port, 'hami_device_plugin_nvml_stuck')}",
        )
        client = self.sb.kube()
        for p in replay_workload(SEED_NODE):
            client.create("pods", p)
        client.close()
        names = [p["metadata"]["name"] for p in replay_workload(SEED_NODE)]
        t = time.monotonic()

        def decided_all() -> bool:
            adm, live = self.admissions(), self.pods()
            return all(
                n in adm and (live[n].get("status") or {}).get("phase") in ("Running", "Failed")
                for n in names
            )

        decided = wait_for(decided_all, ADMIT_DEADLINE_S, 0.2)
        adm, live = self.admissions(), self.pods()
        for n in names:
            rec = adm.get(n) or {}
            self.say(
                f"  {n}: admitted={rec.get('admitted')} in {rec.get('duration_s', 0):.3f}s, phase "
                f"{(live[n].get('status') or {}).get('phase')}; {rec.get('message') or ''}"
            )
        self.check(
            f"the kubelet is not blocked: pods sent to {SEED_NODE} during the hang were decided within "
            f"{ADMIT_DEADLINE_S:.0f}s",
            decided,
            f"{time.monotonic() - t:.1f}s",
        )
        self.check(
            "a plain pod on the hung node runs (in the seed even these hung)",
            (live["during-hang-plain"].get("status") or {}).get("phase") == "Running",
        )
        klog = (self.sb.cfg.logs / f"kubelet-sim-{SEED_NODE}.log").read_text()
        issued = klog.count("Issuing a GetPreferredAllocation call for container")
        self.say(
            f"  kubelet log: {issued} GetPreferredAllocation call(s), "
            f"{klog.count('Making allocation request for device plugin')} Allocate call(s), all answered"
        )
        rc, rep = self.doctor(SEED_NODE, "before")
        codes = [v.get("code") for v in rep.get("verdicts", [])]
        seed = next(
            (v for v in rep.get("verdicts", []) if v.get("code") == "NVML_INIT_HANG_KNOWN_BAD_DRIVER"), None
        )
        self.say(f"  $ hami-agent doctor cluster  -> exit {rc}, findings {codes}")
        if seed:
            self.say(f"    {seed.get('summary')}")
            for ev in (seed.get("evidence") or [])[:6]:
                self.say(f"      > {ev if isinstance(ev, str) else json.dumps(ev)}")
            self.say(f"    fix: {seed.get('fix')}")
        self.check(
            "doctor names NVML_INIT_HANG_KNOWN_BAD_DRIVER with evidence",
            rc == 1 and seed is not None and bool(seed.get("evidence")),
            f"exit {rc}, codes {codes}",
        )
        # the replay's pods are bare pods (no controller would recreate them): the maintenance window
        # refuses to evict such pods unless told to (node_maintenance_force), as kubectl drain does
        proc = self.playbook(REMEDIATE, "remediate", "-e", "node_maintenance_force=true", limit=SEED_NODE)
        self.check(
            "ansible-playbook playbooks/remediate_nvml_hang.yml fixed the node",
            proc.returncode == 0,
            f"exit {proc.returncode}",
        )
        st = self.sb.gpusim_state(SEED_NODE)
        self.check(
            f"{SEED_NODE} runs {FIXED_DRIVER}, MIG layout kept",
            st.get("module_version") == FIXED_DRIVER
            and [g["index"] for g in st["gpus"] if g["mig"]["current"]] == [0, 1, 2],
            f"module {st.get('module_version')}",
        )
        recovered = wait_for(
            lambda: (
                self.metric(port, "hami_device_plugin_nvml_stuck") == 0 and self.allocatable(SEED_NODE) > 0
            ),
            60,
        )
        self.check(
            "the device plugin recovered by itself (NVML answers, GPUs allocatable again)",
            recovered,
            f"allocatable nvidia.com/gpu={self.allocatable(SEED_NODE)}",
        )
        rc, rep = self.doctor(SEED_NODE, "after")
        bad = [v.get("code") for v in rep.get("verdicts", []) if v.get("severity") in ("critical", "error")]
        self.say(
            f"  $ hami-agent doctor cluster  -> exit {rc}, findings "
            f"{[(v.get('code'), v.get('severity')) for v in rep.get('verdicts', [])]}"
        )
        unguarded = identities.kubeconfig(self.sb.cfg.run_dir, "operator") is None
        if unguarded and "ALLOCATION_GUARD_MISSING" in bad:
            # without per-component identities every component is the admin, whom the allocation guard would
            # refuse: the sandbox runs unguarded on purpose (inventories/sandbox), and doctor says so
            self.say("    (ALLOCATION_GUARD_MISSING: expected without HAMI_SANDBOX_IDENTITIES=1, whose run "
                     "installs the guard)")
            bad.remove("ALLOCATION_GUARD_MISSING")
            rc = 0 if not bad else rc
        self.check("doctor is clean (no critical or error finding)", rc == 0 and not bad, f"exit {rc}, {bad}")


    # ----------------------------------------------------------------------------- e) rollout
    def driver_of(self, node: str) -> str:
        st = self.sb.gpusim_state(node)
        return str(st.get("module_version") or "")

    def node_obj(self, node: str) -> dict:
        client = self.sb.kube()
        try:
            return client.get_node(node)
        finally:
            client.close()

    def cordon(self, node: str, on: bool) -> None:
        client = self.sb.kube()
        try:
            client.patch("nodes", node, {"spec": {"unschedulable": True if on else None}})
        finally:
            client.close()

    def roll(self, log: str, report_dir: Path) -> tuple[subprocess.CompletedProcess, float, float]:
        report_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        # the parts a driver pin can touch (and MIG / MPS, whose drift run 2 repairs): the rest of
        # site.yml has nothing to do here and would only lengthen every batch
        proc = self.playbook(SITE, log, "-e", f"nvidia_driver_version={ro.NEW_DRIVER}", "-e",
                             f"site_serial={ro.SERIAL}", "-e", f"site_rollout_report_dir={report_dir}",
                             "--tags", ro.ROLL_TAGS, timeout_s=2400)
        return proc, t0, time.time()

    def step_e(self) -> None:
        self.header("e", f"roll a driver pin change ({ro.OLD_DRIVER} -> {ro.NEW_DRIVER}) under a "
                         "PodDisruptionBudget")
        cfg = self.sb.cfg
        names = [n.name for n in cfg.nodes]
        client = self.sb.kube()
        # 1. the earlier steps' pods are bare pods: a drain refuses to evict what nothing recreates
        for p in client.list_pods(namespace=NAMESPACE):
            client.delete("pods", p["metadata"]["name"], NAMESPACE)
        gone = wait_for(lambda: not self.pods(), 60)
        self.check("the earlier steps' bare pods are deleted (a drain refuses pods no controller recreates)",
                   gone)
        # 2. the workload under its budget
        rs, pdb = ro.workload()
        try:
            client.create("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": ro.NAMESPACE}})
        except KubeError as exc:
            if exc.status != 409:
                raise
        client.call("POST", f"/apis/apps/v1/namespaces/{ro.NAMESPACE}/replicasets", verb="create",
                    kind="replicaset", body=rs, idempotent=False)
        client.call("POST", f"/apis/policy/v1/namespaces/{ro.NAMESPACE}/poddisruptionbudgets", verb="create",
                    kind="poddisruptionbudget", body=pdb, idempotent=False)
        watch = ro.BudgetWatch(client).start()
        ok = wait_for(lambda: sum(watch.healthy.values()) == ro.REPLICAS, 120)
        placement = {}
        for p in client.list_pods(namespace=ro.NAMESPACE):
            placement.setdefault(p["spec"].get("nodeName") or "-", []).append(p["metadata"]["name"])
        pdb_path = f"/apis/policy/v1/namespaces/{ro.NAMESPACE}/poddisruptionbudgets/{ro.APP}"
        budget = client.call("GET", pdb_path, verb="get", kind="poddisruptionbudget").get("status") or {}
        self.check(f"workload: ReplicaSet {ro.APP} {ro.REPLICAS}/{ro.REPLICAS} Ready, PodDisruptionBudget "
                   f"minAvailable {ro.MIN_AVAILABLE}", ok and budget.get("disruptionsAllowed") == 1,
                   f"pods per node { {n: len(v) for n, v in sorted(placement.items())} }, disruptionsAllowed "
                   f"{budget.get('disruptionsAllowed')}")
        self.sb.gpusim(ro.GATE_FAULT_NODE, "gpu-lost", "--gpu", "3", "on")
        self.say(f"  fault: GPU 3 of {ro.GATE_FAULT_NODE} falls off the bus (gpusim gpu-lost): its NVML gate "
                 "must stop the roll")
        self.cordon(ro.OPERATOR_NODE, True)
        self.say(f"  an operator cordons {ro.OPERATOR_NODE} (kubectl cordon): it must stay cordoned")
        watch.arm()
        try:
            self._roll_with_a_failing_gate(watch, names)
            self._resume_with_drift(watch, names)
            self._second_run()
        finally:
            watch.stop()
            self.cordon(ro.OPERATOR_NODE, False)
            client.close()
        self.rollout.update({
            "serial": ro.SERIAL,
            "max_cordoned": watch.max_by_rollout,
            "max_cordoned_including_operator": watch.max_by_anyone,
            "max_unavailable": ro.REPLICAS - (watch.lowest if watch.lowest is not None else ro.REPLICAS),
            "pdb_min_available": ro.MIN_AVAILABLE,
            "pdb_violations": watch.violations,
            "lowest_healthy": watch.lowest,
            "budget_events": len(watch.timeline),
        })
        (self.out / "rollout-timeline.json").write_text(json.dumps(watch.timeline))
        self.check(f"the budget held at every change: lowest healthy {watch.lowest} >= minAvailable "
                   f"{ro.MIN_AVAILABLE} ({len(watch.timeline)} watch events)",
                   watch.violations == 0 and (watch.lowest or 0) >= ro.MIN_AVAILABLE,
                   f"violations {watch.violations}")
        self.check(f"never more than serial={ro.SERIAL} node(s) cordoned by the rollout at once",
                   0 < watch.max_by_rollout <= ro.SERIAL,
                   f"max {watch.max_by_rollout} (with the operator's cordon: {watch.max_by_anyone})")

    def _show_batches(self, recs: dict) -> None:
        for b in ro.batches("", recs):
            gates = ", ".join(f"{g}={'pass' if ok else 'FAIL'}" for g, ok in b["gates"].items())
            self.say(f"    batch {b['batch']}: {', '.join(b['nodes'])}: evicted {len(b['evicted'])} pod(s) "
                     f"({b['budget_refusals']} PodDisruptionBudget refusal(s)); gates {gates or '-'}")

    def _roll_with_a_failing_gate(self, watch: ro.BudgetWatch, names: list[str]) -> None:
        self.say(f"  run 1: site.yml with nvidia_driver_version={ro.NEW_DRIVER}, serial {ro.SERIAL}")
        rdir = self.out / "rollout-run1"
        proc, t0, t1 = self.roll("rollout-run1", rdir)
        recs = ro.records(rdir)
        self._show_batches(recs)
        self.rollout.setdefault("batches", []).extend(ro.batches("run1", recs))
        self.check("run 1 stopped at the first failed node (exit != 0)", proc.returncode != 0,
                   f"exit {proc.returncode}")
        for node in (ro.MIG_NODE, ro.MPS_NODE):
            n = self.node_obj(node)
            self.check(f"{node}: rolled to {ro.NEW_DRIVER}, gates passed, uncordoned",
                       self.driver_of(node) == ro.NEW_DRIVER and not n["spec"].get("unschedulable")
                       and node in recs and not recs[node].get("failed_gate"),
                       f"driver {self.driver_of(node)}, gates {recs.get(node, {}).get('gates')}")
        n = self.node_obj(ro.GATE_FAULT_NODE)
        ann = n["metadata"].get("annotations") or {}
        client = self.sb.kube()
        events = [e for e in client.list("events", "default")[0]
                  if e.get("reason") == "HamiMaintenanceGateFailed"
                  and (e.get("involvedObject") or {}).get("name") == ro.GATE_FAULT_NODE]
        client.close()
        self.check(f"{ro.GATE_FAULT_NODE} failed its nvml gate and stays cordoned, annotated and with an "
                   "event naming the gate and its runbook",
                   n["spec"].get("unschedulable") is True and ann.get(ro.FAILED_GATE) == "nvml"
                   and "rollout_gates.md#nvml" in ann.get(ro.RUNBOOK, "") and bool(events),
                   f"{ro.FAILED_GATE}={ann.get(ro.FAILED_GATE)}, {ro.RUNBOOK}={ann.get(ro.RUNBOOK)}, "
                   f"event: {events[0]['message'][:160] if events else 'none'}")
        reqs = ro.requests_between(self.sb.request_log, t0, t1)
        touched = [p for p in ro.evictions(reqs) if any(x in p for x in self._pods_on(ro.OPERATOR_NODE))]
        n = self.node_obj(ro.OPERATOR_NODE)
        self.check(f"{ro.OPERATOR_NODE} (the later batch) untouched: driver {ro.OLD_DRIVER}, no eviction, no "
                   "cordon of ours",
                   self.driver_of(ro.OPERATOR_NODE) == ro.OLD_DRIVER and not touched
                   and ro.OPERATOR_NODE not in ro.cordons(reqs) and ro.OPERATOR_NODE not in recs
                   and (n["metadata"].get("annotations") or {}).get(ro.CORDONED_BY) is None,
                   f"driver {self.driver_of(ro.OPERATOR_NODE)}, cordons written {ro.cordons(reqs)}")

    def _pods_on(self, node: str) -> list[str]:
        client = self.sb.kube()
        try:
            return [p["metadata"]["name"] for p in client.list_pods(field_selector=f"spec.nodeName={node}")]
        finally:
            client.close()

    def _resume_with_drift(self, watch: ro.BudgetWatch, names: list[str]) -> None:
        self.sb.gpusim(ro.GATE_FAULT_NODE, "gpu-lost", "--gpu", "3", "off")
        self.say(f"  the operator fixes {ro.GATE_FAULT_NODE} (GPU 3 back); meanwhile the MIG layout of "
                 f"{ro.MIG_NODE} and the compute mode of {ro.MPS_NODE} drift")
        before = {n: self._pods_on(n) for n in (ro.MIG_NODE, ro.MPS_NODE)}
        self.node_exec(ro.MIG_NODE, "nvidia-smi", "mig", "-i", "0", "-dci")
        self.node_exec(ro.MIG_NODE, "nvidia-smi", "mig", "-i", "0", "-dgi")
        self.node_exec(ro.MPS_NODE, "nvidia-smi", "-i", "0", "-c", "DEFAULT")
        self.say(f"  run 2: site.yml again (GPU pods before: { {k: len(v) for k, v in before.items()} })")
        rdir = self.out / "rollout-run2"
        proc, _t0, _t1 = self.roll("rollout-run2", rdir)
        recs = ro.records(rdir)
        self._show_batches(recs)
        self.rollout.setdefault("batches", []).extend(ro.batches("run2", recs))
        self.check("run 2 finished the roll (exit 0)", proc.returncode == 0, f"exit {proc.returncode}")
        for node, role in ((ro.MIG_NODE, "nvidia_mig"), (ro.MPS_NODE, "nvidia_mps")):
            rec = recs.get(node) or {}
            roles = [d.get("role") for d in rec.get("disruptions") or []]
            self.check(f"{node}: the {role} change on a node with running GPU pods evicted them first",
                       role in roles and len(rec.get("evicted") or []) > 0 and not rec.get("failed_gate"),
                       f"disruptions {[d.get('change') for d in rec.get('disruptions') or []]}, evicted "
                       f"{rec.get('evicted')}")
        rec = recs.get(ro.GATE_FAULT_NODE) or {}
        n = self.node_obj(ro.GATE_FAULT_NODE)
        self.check(f"{ro.GATE_FAULT_NODE} resumed first (batch 1): gates passed, uncordoned, annotations "
                   "cleared",
                   bool(rec) and int(rec.get("batch") or 0) == 1 and not rec.get("failed_gate")
                   and not n["spec"].get("unschedulable")
                   and not any(k.startswith("hami.io/maintenance")
                               for k in n["metadata"].get("annotations") or {}),
                   f"gates {rec.get('gates')}")
        rec = recs.get(ro.OPERATOR_NODE) or {}
        n = self.node_obj(ro.OPERATOR_NODE)
        self.check(f"{ro.OPERATOR_NODE} rolled and stays cordoned (its operator's cordon)",
                   rec.get("cordoned_by") == "operator" and n["spec"].get("unschedulable") is True
                   and not rec.get("failed_gate"),
                   f"cordoned_by {rec.get('cordoned_by')}, evicted {len(rec.get('evicted') or [])}")
        drivers = {n: self.driver_of(n) for n in names}
        self.check(f"every GPU node runs {ro.NEW_DRIVER}", set(drivers.values()) == {ro.NEW_DRIVER},
                   str(drivers))

    def _second_run(self) -> None:
        self.say("  run 3: site.yml again: nothing is pending")
        proc, t0, t1 = self.roll("rollout-run3", self.out / "rollout-run3")
        rc = ro.recap(proc.stdout)
        reqs = ro.requests_between(self.sb.request_log, t0, t1)
        changed = {h: r.get("changed") for h, r in rc.items()}
        self.check("second run: changed=0 on every host, no cordon and no eviction in the API request log",
                   proc.returncode == 0 and rc and all(v == 0 for v in changed.values())
                   and not ro.cordons(reqs) and not ro.evictions(reqs),
                   f"changed {changed}; cordons {ro.cordons(reqs)}; evictions {len(ro.evictions(reqs))}")


    def step_f(self) -> None:
        """The same GPUs through Dynamic Resource Allocation (sandbox/dra_step.py): a node of its own, the
        real ``hami-agent dra``, the simulated kubelet's DRA manager and kube-scheduler's allocator."""
        from sandbox import dra_step

        self.header("f", "DRA: claims shared the HAMi way (hami-agent dra)")
        result = dra_step.run(dra_step.DraStepCluster.from_sandbox(self.sb), say=self.say)
        for name, ok, detail in result.checks:
            self.check(f"DRA: {name}", ok, detail)
        if not result.checks:
            self.check("DRA step ran", False, "no check ran")

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
            demo.step_a()
        except SandboxError as exc:
            demo.check("sandbox started", False, str(exc))
            raise
        for step in (demo.step_b, demo.step_c, demo.step_d, demo.step_e, demo.step_f):
            demo.guarded(step)
    except KeyboardInterrupt:
        interrupted = True
        demo.check("demo ran to the end", False, "interrupted")
    except SandboxError:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        demo.header("g", "report")
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
