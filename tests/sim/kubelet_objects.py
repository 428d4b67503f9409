"""Objects as a kubelet fills them, for the simulated clusters of the benchmarks: a real one's size, so a
client's decoding costs here what it costs in a cluster.

``gpu_node``: a Node as a kubelet registers and reports it (Kubernetes 1.33; a GPU node with GPU Feature
Discovery's labels and the 50 images ``--node-status-max-images`` lets it report: ~15 KB of JSON).

``kubelet_statuses``: the pod status a kubelet writes while it starts a pod: two status writes, as the
kubelet's status manager sends them (kubernetes
``pkg/kubelet/status/status_manager.go``; the status is ``generateAPIPodStatus``'s, Kubernetes 1.33):

1. admitted, containers being created: ``Pending``, ``ContainerCreating``, the pod's conditions, host IP,
   start time;
2. containers started: ``Running``, every condition true, pod IP, each container's ID, image ID, state,
   resources and mounts.

Each write carries the pod's whole conditions list: this API server applies a strategic merge patch as a
JSON merge patch (docs/testing.md), so a list sent is the list stored.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tests.sim.apiserver_store import now_rfc3339

Obj = dict[str, Any]


def _hex(seed: str, n: int = 64) -> str:
    return (hashlib.sha256(seed.encode()).hexdigest() * 2)[:n]


def _ips(uid: str) -> tuple[str, str]:
    h = hashlib.sha256(uid.encode()).digest()
    return f"10.{h[0] % 4}.{h[1]}.{max(h[2], 1)}", f"10.244.{h[3]}.{max(h[4], 2)}"


def _conditions(pod: Obj, ready: bool, now: str) -> list[Obj]:
    scheduled = [c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"]
    state = "True" if ready else "False"
    out = [{"type": "PodReadyToStartContainers", "status": state, "lastProbeTime": None,
            "lastTransitionTime": now},
           {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}]
    for kind in ("Ready", "ContainersReady"):
        cond: Obj = {"type": kind, "status": state, "lastProbeTime": None, "lastTransitionTime": now}
        if not ready:
            cond.update(reason="ContainersNotReady", message="containers with unready status: [" + " ".join(
                c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []) + "]")
        out.append(cond)
    return out + (scheduled or [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                 "lastTransitionTime": now}])


def _container_status(pod: Obj, c: Obj, running: bool, now: str) -> Obj:
    uid = (pod.get("metadata") or {}).get("uid", "")
    image = str(c.get("image") or "")
    out: Obj = {"name": c.get("name", ""), "image": image, "imageID": "", "ready": running,
                "restartCount": 0, "started": running, "lastState": {},
                "state": ({"running": {"startedAt": now}} if running else
                          {"waiting": {"reason": "ContainerCreating"}})}
    if running:
        out["imageID"] = f"{image.partition(':')[0]}@sha256:{_hex(image)}"
        out["containerID"] = f"containerd://{_hex(uid + c.get('name', ''))}"
        out["resources"] = c.get("resources") or {}
        out["allocatedResources"] = (c.get("resources") or {}).get("requests") or {}
        out["volumeMounts"] = [{**m, "recursiveReadOnly": "Disabled"} if m.get("readOnly") else dict(m)
                               for m in c.get("volumeMounts") or [] if isinstance(m, dict)]
    return out


def kubelet_statuses(pod: Obj) -> list[Obj]:
    """The status writes of a kubelet starting ``pod`` (as it was scheduled), in order."""
    now = now_rfc3339()
    uid = (pod.get("metadata") or {}).get("uid", "")
    host_ip, pod_ip = _ips(uid)
    containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    qos = (pod.get("status") or {}).get("qosClass", "BestEffort")
    creating = {"phase": "Pending", "conditions": _conditions(pod, False, now), "hostIP": host_ip,
                "hostIPs": [{"ip": host_ip}], "startTime": now, "qosClass": qos,
                "containerStatuses": [_container_status(pod, c, False, now) for c in containers]}
    running = {**creating, "phase": "Running", "conditions": _conditions(pod, True, now), "podIP": pod_ip,
               "podIPs": [{"ip": pod_ip}],
               "containerStatuses": [_container_status(pod, c, True, now) for c in containers]}
    return [creating, running]


def gpu_node(name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None,
             capacity: dict[str, str] | None = None) -> Obj:
    """A GPU Node as a kubelet (and GPU Feature Discovery) leave it; ``labels`` and the GPU resources in
    ``allocatable``/``capacity`` are the caller's, added to the usual ones."""
    now = now_rfc3339()
    ip = _ips(name)[0]
    base = {"cpu": "64", "ephemeral-storage": "1845350324Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
            "memory": "1056717688Ki", "pods": "110"}
    images = [{"names": [f"nvcr.io/nvidia/workload-{i:02d}@sha256:{_hex('workload-' + str(i))}",
                         f"nvcr.io/nvidia/workload-{i:02d}:25.{i % 12 + 1:02d}-py3"],
               "sizeBytes": 1_000_000_000 + 37_000_000 * i} for i in range(50)]
    gfd = {"nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "172",
           "nvidia.com/cuda.driver.rev": "08", "nvidia.com/cuda.runtime.major": "12",
           "nvidia.com/cuda.runtime.minor": "8", "nvidia.com/gfd.timestamp": "1764300000",
           "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
           "nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine":
           "PowerEdge-XE9680", "nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.product": "NVIDIA-H200",
           "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
           "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single", "nvidia.com/mps.capable":
           "false", "nvidia.com/vgpu.present": "false", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name,
        "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                   "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                   "node.kubernetes.io/instance-type": "gpu-h200-8", "topology.kubernetes.io/region": "r1",
                   "topology.kubernetes.io/zone": "r1-a", "feature.node.kubernetes.io/pci-10de.present":
                   "true", **gfd, **(labels or {})},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                        "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
                        "projectcalico.org/IPv4Address": f"{ip}/16"}},
        "spec": {"podCIDR": f"10.244.{sum(name.encode()) % 250}.0/24",
                 "podCIDRs": [f"10.244.{sum(name.encode()) % 250}.0/24"], "providerID": f"metal://{name}"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "allocatable": {**base, **(allocatable or {})}, "capacity": {**base, **(capacity or {})},
            "conditions": [
                {"type": t, "status": "False", "lastHeartbeatTime": now, "lastTransitionTime": now,
                 "reason": f"KubeletHasSufficient{r}",
                 "message": f"kubelet has sufficient {r.lower()} available"}
                for t, r in (("MemoryPressure", "Memory"), ("DiskPressure", "Disk"), ("PIDPressure", "PID"))
            ] + [{"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now,
                  "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": images,
            "nodeInfo": {"architecture": "amd64", "bootID": _hex(name + "boot", 36),
                         "containerRuntimeVersion": "containerd://1.7.27",
                         "kernelVersion": "6.8.0-60-generic",
                         "kubeProxyVersion": "", "kubeletVersion": "v1.33.2", "machineID": _hex(name, 32),
                         "operatingSystem": "linux", "osImage": "Ubuntu 24.04.2 LTS",
                         "systemUUID": _hex(name + "uuid", 36)},
            "runtimeHandlers": [{"name": n, "features": {"recursiveReadOnlyMounts": True,
                                                         "userNamespaces": True}}
                                for n in ("nvidia", "runc", "")],
            "features": {"supplementalGroupsPolicy": True}}}


__all__ = ["gpu_node", "kubelet_statuses"]
