"""Test helpers: run the doctor CLI in-process, seed API objects, lay out a simulated node's files."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from hami_agent.cli import main as agent_main

GPU_UUID = "GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6"
REGISTER = json.dumps([{"id": GPU_UUID, "index": 0, "count": 10, "devmem": 97871, "devcore": 100,
                        "type": "NVIDIA H20", "mode": "hami-core", "health": True}])


def run_doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = agent_main(["doctor", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def codes(report: dict[str, Any]) -> list[str]:
    return [v["code"] for v in report["verdicts"]]


def verdict(report: dict[str, Any], code: str) -> dict[str, Any]:
    for v in report["verdicts"]:
        if v["code"] == code:
            return v
    raise AssertionError(f"no {code} in {codes(report)}")


def ago(seconds: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str = "gpu-1", annotations: dict[str, str] | None = None, gpus: int = 10,
         extra_alloc: dict[str, str] | None = None) -> dict[str, Any]:
    alloc = {"cpu": "16", "nvidia.com/gpu": str(gpus), **(extra_alloc or {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": annotations or {}},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def gpu_pod(name: str, ns: str = "default", *, node_name: str | None = None, age_s: float = 600,
            annotations: dict[str, str] | None = None, scheduler: str = "hami-scheduler",
            phase: str = "Pending", gpumem: int | None = 4096,
            env: list[dict] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"}
    if gpumem:
        limits["nvidia.com/gpumem"] = str(gpumem)
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [
        {"name": "main", "image": "cuda", "resources": {"limits": limits}, **({"env": env} if env else {})}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {},
                         "creationTimestamp": rfc3339(ago(age_s))},
            "spec": spec, "status": {"phase": phase}}


def event(pod: dict[str, Any], reason: str, message: str, type_: str = "Warning",
          component: str = "hami-scheduler") -> dict[str, Any]:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{reason.lower()}", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               **({"uid": meta["uid"]} if meta.get("uid") else {})},
            "reason": reason, "message": message, "type": type_, "source": {"component": component},
            "lastTimestamp": rfc3339(ago(30)), "count": 1}


def host_root_from_gpusim(state: dict[str, Any], root: Path) -> Path:
    """The driver's /sys and /proc files for a simulated node: what a real node shows for the same
    GPUs (module version, one directory per GPU, MIG capability dirs per GPU instance)."""
    (root / "sys/module/nvidia").mkdir(parents=True, exist_ok=True)
    (root / "sys/module/nvidia/version").write_text(state["module_version"] + "\n")
    for gpu in state["gpus"]:
        bus = gpu["pci_bus_id"].lower()[4:]  # /proc uses the 4-digit domain form
        d = root / "proc/driver/nvidia/gpus" / bus
        d.mkdir(parents=True, exist_ok=True)
        minor = gpu.get("minor_number", gpu["index"])
        (d / "information").write_text(f"Model: \t\t {gpu['name']}\nDevice Minor: \t {minor}\n")
        if gpu["mig"]["current"]:
            for gi in gpu["mig"].get("gpu_instances", []):
                caps = root / f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi['id']}"
                caps.mkdir(parents=True, exist_ok=True)
                (caps / "access").write_text(f"DeviceFileMinor: {100 + gi['id']}\nDeviceFileMode: 292\n")
    return root
