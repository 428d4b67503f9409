"""The simulated API server fills objects as kube-apiserver does (tests/sim/apiserver_pods.py defaults,
tests/sim/apiserver_managed.py managedFields): a client never sees the bare object a test writes."""

from __future__ import annotations

import json

import pytest

from hami_agent.k8s.client import KubeClient
from tests.sim.apiserver import ApiServer
from tests.sim.apiserver_pods import default_pod, qos_class
from tests.sim.kubelet_objects import gpu_node, kubelet_statuses


def bare_pod(name: str = "p", **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "cuda:12.8", "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}], **spec}}


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


def test_defaults_fill_only_what_is_missing():
    pod = bare_pod(schedulerName="hami-scheduler", tolerations=[{"operator": "Exists"}])
    default_pod(pod)
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert spec["schedulerName"] == "hami-scheduler"  # set by the test: kept
    assert spec["tolerations"] == [{"operator": "Exists"}]  # tolerates everything: nothing added
    assert (spec["dnsPolicy"], spec["restartPolicy"], spec["terminationGracePeriodSeconds"]) == (
        "ClusterFirst", "Always", 30)
    assert (spec["priority"], spec["preemptionPolicy"], spec["serviceAccountName"]) == (
        0, "PreemptLowerPriority", "default")
    assert c["resources"]["requests"] == c["resources"]["limits"]  # SetDefaults_Pod: requests from limits
    assert c["imagePullPolicy"] == "IfNotPresent"
    token = [v for v in spec["volumes"] if v["name"].startswith("kube-api-access-")]
    mount = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert len(token) == 1
    assert c["volumeMounts"] == [{"name": token[0]["name"], "readOnly": True, "mountPath": mount}]


def test_default_tolerations_image_policy_and_qos():
    pod = bare_pod()
    pod["spec"]["containers"][0]["image"] = "registry:5000/cuda"  # a port, no tag: latest
    pod["spec"]["automountServiceAccountToken"] = False
    default_pod(pod)
    assert [t["key"] for t in pod["spec"]["tolerations"]] == ["node.kubernetes.io/not-ready",
                                                               "node.kubernetes.io/unreachable"]
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    assert "volumes" not in pod["spec"]
    assert qos_class(pod) == "BestEffort"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    default_pod(pod)
    assert qos_class(pod) == "Guaranteed"
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    assert qos_class(pod) == "Burstable"


def test_managed_fields_follow_each_writer(api):
    api.create(bare_pod())  # in-process: the manager "sim-test"
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    client = KubeClient.from_kubeconfig(api.kubeconfig_path, component="writer")  # "hami-agent/<v> ..."
    client.patch_pod_metadata("default", "p", annotations={"a": "1"})
    client.bind_pod("default", "p", "n1")  # a binding records no field manager
    client.patch_pod_status("default", "p", {"phase": "Running"})
    pod = client.get_pod("default", "p")
    entries = {(e["manager"], e.get("subresource")): e for e in pod["metadata"]["managedFields"]}
    assert set(entries) == {("sim-test", None), ("hami-agent", None), ("hami-agent", "status")}
    creator = entries["sim-test", None]
    assert "f:dnsPolicy" in creator["fieldsV1"]["f:spec"]  # defaults count as the creator's
    assert "f:status" not in creator["fieldsV1"]  # the main resource's status is the server's
    assert entries["hami-agent", None]["fieldsV1"] == {"f:metadata": {"f:annotations": {"f:a": {}}}}
    assert entries["hami-agent", "status"]["fieldsV1"] == {"f:status": {"f:phase": {}}}
    assert "f:nodeName" not in json.dumps(pod["metadata"]["managedFields"])

    # a field another manager sets moves to it; a write that changes nothing changes nothing
    api.patch("Pod", "default", "p", {"metadata": {"annotations": {"a": "2"}}})
    after = client.get_pod("default", "p")
    assert {(e["manager"], e.get("subresource")) for e in after["metadata"]["managedFields"]} == {
        ("sim-test", None), ("hami-agent", "status")}  # its only field was taken over
    client.patch_pod_metadata("default", "p", annotations={"a": "2"})
    unchanged = client.get_pod("default", "p")
    assert unchanged["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
    assert unchanged["metadata"]["managedFields"] == after["metadata"]["managedFields"]


def test_an_update_without_managed_fields_keeps_them(api):
    client = KubeClient.from_kubeconfig(api.kubeconfig_path)
    client.create("pods", bare_pod())
    pod = client.get_pod("default", "p")
    kept = pod["metadata"].pop("managedFields")
    pod["metadata"].setdefault("labels", {})["x"] = "y"
    client.call("PUT", "/api/v1/namespaces/default/pods/p", verb="update", kind="pod", body=pod)
    got = client.get_pod("default", "p")["metadata"]["managedFields"]
    assert len(kept) == len(got) == 1  # one manager: the stored entry, grown by the new field
    assert "f:dnsPolicy" in got[0]["fieldsV1"]["f:spec"]  # kept from the stored entry
    assert got[0]["fieldsV1"]["f:metadata"]["f:labels"] == {"f:x": {}}


def test_kubelet_objects_are_a_real_ones_size():
    node = gpu_node("node-001", {"gpu": "on"}, {"nvidia.com/gpu": "80"})
    assert len(json.dumps(node)) > 10_000 and len(node["status"]["images"]) == 50
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "80"
    assert node["metadata"]["labels"]["gpu"] == "on"
    pod = bare_pod()
    pod["metadata"]["uid"] = "u1"
    creating, running = kubelet_statuses(pod)
    assert (creating["phase"], running["phase"]) == ("Pending", "Running")
    assert creating["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert running["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert {c["type"] for c in running["conditions"]} >= {"Ready", "PodScheduled", "Initialized"}
