"""The demo's shared state and helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import identities, podman
from sandbox.cluster import Sandbox, _env
from sandbox.config import GPUSIM_LIB, REPO
from sandbox.workload import NAMESPACE

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

