"""The DRA simulators: the CEL environment, resource.k8s.io validation and the structured allocator."""

from fractions import Fraction

import pytest

from tests.sim.apiserver import ApiServer
from tests.sim.dra_allocator import DraAllocator, consumed_capacity, taint_blocks
from tests.sim.dra_cel import DEFAULT as CEL
from tests.sim.dra_cel import CelError, format_quantity

pytestmark = pytest.mark.unit

DRIVER = "gpu.hami.io"
GIB = 2**30


def gpu(name, mem="80Gi", taints=None, **attrs):
    dev = {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"type": {"string": "gpu"}, **{k: v for k, v in attrs.items()}},
        "capacity": {
            "memory": {
                "value": mem,
                "requestPolicy": {"default": mem, "validRange": {"min": "1Mi", "max": mem, "step": "1Mi"}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
            },
        },
    }
    if taints:
        dev["taints"] = taints
    return dev


# ------------------------------------------------------------------------------------------------ CEL
def test_cel_device_environment():
    dev = {
        "attributes": {
            "index": {"int": 3},
            "driverVersion": {"version": "570.172.8"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
        "allowMultipleAllocations": True,
    }
    yes = [
        'device.driver == "gpu.hami.io" && device.attributes["gpu.hami.io"].index == 3',
        'device.capacity["gpu.hami.io"].memory.compareTo(quantity("20Gi")) > 0',
        'device.capacity["gpu.hami.io"].memory == quantity("81920Mi")',
        'device.attributes["gpu.hami.io"].driverVersion.isGreaterThan(semver("570.158.1"))',
        'device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci")',
        '!has(device.attributes["other.io"].x) && device.allowMultipleAllocations',
        'quantity("1.5Gi").isInteger() && quantity("100m").asApproximateFloat() == 0.1',
    ]
    for expr in yes:
        assert CEL.matches(expr, DRIVER, dev), expr
    with pytest.raises(CelError, match="no such member"):  # unknown field: allocation aborts
        CEL.matches('device.attributes["gpu.hami.io"].nope == 1', DRIVER, dev)
    with pytest.raises(CelError, match="must evaluate to bool"):
        CEL.matches('"yes"', DRIVER, dev)
    with pytest.raises(CelError, match="compilation failed"):
        CEL.matches("device.driver ==", DRIVER, dev)
    with pytest.raises(CelError):  # cel.bind is not offered: harsher than kube-scheduler, never kinder
        CEL.matches('cel.bind(x, device.driver, x == "gpu.hami.io")', DRIVER, dev)
    assert format_quantity(Fraction(20 * GIB)) == "20Gi" and format_quantity(Fraction(30)) == "30"


# ------------------------------------------------------------------------------------------------ API
def test_claims_keep_their_spec_and_allocation_and_refuse_bad_selectors():
    with ApiServer() as api:
        from hami_agent.k8s.client import KubeClient
        from hami_agent.k8s.errors import KubeError

        c = KubeClient.from_kubeconfig(api.kubeconfig_path)
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "selectors": [{"cel": {"expression": "device.driver =="}}],
                            },
                        }
                    ]
                }
            },
        }
        with pytest.raises(
            KubeError,
            match=r'ResourceClaim.resource.k8s.io "c" is invalid: '
            r"spec.devices.requests\[0\].exactly.selectors\[0\].cel.expression",
        ):
            c.create("resourceclaims", claim)
        del claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
        claim["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
        created = c.create("resourceclaims", claim, namespace="default")
        assert "status" not in created  # a tenant cannot pre-fill the scheduler's status on create
        alloc = {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"}]}
        }
        c.patch("resourceclaims", "c", {"status": {"allocation": alloc}}, "default", subresource="status")
        alloc["devices"]["results"][0]["device"] = "gpu-1"
        with pytest.raises(KubeError, match='status.allocation: Invalid value: "object": field is immutable'):
            c.patch("resourceclaims", "c", {"status": {"allocation": alloc}}, "default", subresource="status")
        with pytest.raises(KubeError, match='spec: Invalid value: "object": field is immutable'):
            c.patch("resourceclaims", "c", {"spec": {"devices": {"requests": []}}}, "default")
        c.patch("resourceclaims", "c", {"status": {"reservedFor": None}}, "default")  # main resource: ignored
        assert (
            api.get("resourceclaims", "default", "c")["status"]["allocation"]["devices"]["results"][0][
                "device"
            ]
            == "gpu-0"
        )


def test_slices_are_validated_and_their_generation_follows_the_spec():
    with ApiServer() as api:
        from hami_agent.k8s.client import KubeClient
        from hami_agent.k8s.errors import KubeError

        c = KubeClient.from_kubeconfig(api.kubeconfig_path)
        sl = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "n-0"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "n",
                "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
                "devices": [gpu("gpu-0")],
            },
        }
        bad = {**sl, "spec": {**sl["spec"], "devices": [{**gpu("gpu-0"), "allowMultipleAllocations": False}]}}
        with pytest.raises(
            KubeError, match="requestPolicy: Forbidden: allowMultipleAllocations must be true"
        ):
            c.create("resourceslices", bad)
        obj = c.create("resourceslices", sl)
        assert obj["metadata"]["generation"] == 1
        obj["spec"]["nodeName"] = "other"
        with pytest.raises(KubeError, match='spec.nodeName: Invalid value: "other": field is immutable'):
            c.replace("resourceslices", obj)
        obj["spec"]["nodeName"] = "n"
        obj["spec"]["devices"][0]["taints"] = [{"key": "gpu.hami.io/unhealthy", "effect": "Sometimes"}]
        with pytest.raises(KubeError, match='effect: Unsupported value: "Sometimes"'):
            c.replace("resourceslices", obj)
        obj["spec"]["devices"][0]["taints"][0]["effect"] = "NoSchedule"
        assert c.replace("resourceslices", obj)["metadata"]["generation"] == 2


# ------------------------------------------------------------------------------------------------ allocator
def test_consumed_capacity_follows_the_request_policy():
    dev = gpu("g", mem="80Gi")
    dev["capacity"]["cores"]["requestPolicy"] = {"default": "10", "validValues": ["10", "25", "50", "100"]}
    assert consumed_capacity(dev, {"memory": "20Gi", "cores": "30"}) == {"memory": 20 * GIB, "cores": 50}
    assert consumed_capacity(dev, {"memory": "1500000"})["memory"] == 2**20 * 2  # 1.43Mi -> 2Mi (step)
    assert consumed_capacity(dev, {}) == {"memory": 80 * GIB, "cores": 10}  # the policies' defaults
    assert consumed_capacity(dev, {"memory": "90Gi"}) is None  # over max
    assert consumed_capacity(dev, {"cores": "200"}) is None  # above every valid value
    assert consumed_capacity(dev, {"bananas": "1"}) is None  # not a capacity of the device


def test_taints_need_tolerations():
    t = [{"key": "gpu.hami.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
    assert taint_blocks({"taints": t}, [])
    assert not taint_blocks({"taints": t}, [{"key": "gpu.hami.io/unhealthy", "operator": "Exists"}])
    assert taint_blocks({"taints": t}, [{"key": "gpu.hami.io/unhealthy", "value": "xid-48"}])
    assert not taint_blocks({"taints": [{**t[0], "effect": "None"}]}, [])


class FakeInformer:
    def __init__(self, items):
        self.items = items

    def list(self):
        return list(self.items)

    def get(self, ns, name):
        return next((o for o in self.items if o["metadata"]["name"] == name), None)


def allocator(devices, claims=(), generation=0, count=1, extra_slices=()):
    a = DraAllocator(client=None)
    sl = {
        "metadata": {"name": "n-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "n",
            "pool": {"name": "n", "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }
    a.slices = FakeInformer([sl, *extra_slices])
    a.classes = FakeInformer(
        [
            {
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            }
        ]
    )
    a.claims = FakeInformer(list(claims))
    return a


def claim(name, requests, constraints=None):
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"devices": {"requests": requests, "constraints": constraints or []}},
    }


def req(name="gpu", count=1, mode="ExactCount", memory=None, selectors=(), tolerations=None, first=None):
    exact = {
        "deviceClassName": DRIVER,
        "allocationMode": mode,
        "count": count,
        "selectors": [{"cel": {"expression": e}} for e in selectors],
    }
    if memory:
        exact["capacity"] = {"requests": {"memory": memory}}
    if tolerations:
        exact["tolerations"] = tolerations
    return {"name": name, "firstAvailable": first} if first else {"name": name, "exactly": exact}


def test_shared_devices_fill_up_by_consumed_capacity():
    a = allocator([gpu("gpu-0")])
    c1 = claim("c1", [req(memory="50Gi")])
    picks = a.allocate_on_node("n", [c1])
    assert [(p.cand.device["name"], p.consumed["memory"]) for p in picks[0]] == [("gpu-0", 50 * GIB)]
    c1["status"] = {"allocation": a._allocation("n", c1, picks[0])}
    r = c1["status"]["allocation"]["devices"]["results"][0]
    assert r["consumedCapacity"] == {"cores": "100", "memory": "50Gi"} and r["shareID"]
    a.claims = FakeInformer([c1])
    # cores were not requested: the default (all 100) was consumed, so nothing is left for another claim
    assert a.allocate_on_node("n", [claim("c2", [req(memory="10Gi")])]) is None


def test_exclusive_devices_count_all_mode_and_incomplete_pools():
    excl = [{"name": f"mig-{i}", "attributes": {"type": {"string": "mig"}}} for i in range(3)]
    a = allocator(excl)
    assert len(a.allocate_on_node("n", [claim("c", [req(count=2)])])[0]) == 2
    assert a.allocate_on_node("n", [claim("c", [req(count=4)])]) is None
    assert len(a.allocate_on_node("n", [claim("c", [req(mode="All")])])[0]) == 3
    assert allocator(excl, count=2).allocate_on_node("n", [claim("c", [req()])]) is None  # 1 of 2 slices


def test_selectors_tolerations_constraints_and_first_available():
    t = [{"key": "gpu.hami.io/unhealthy", "value": "gpu-lost", "effect": "NoSchedule"}]
    a = allocator(
        [
            gpu("gpu-0", taints=t, numa={"int": 0}),
            gpu("gpu-1", numa={"int": 1}),
            gpu("gpu-2", numa={"int": 1}),
        ]
    )
    [[p]] = a.allocate_on_node("n", [claim("c", [req()])])
    assert p.cand.device["name"] == "gpu-1"  # the tainted GPU is avoided
    tol = [{"key": "gpu.hami.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    [[p]] = a.allocate_on_node("n", [claim("c", [req(tolerations=tol)])])
    assert p.cand.device["name"] == "gpu-0"
    two = claim(
        "c", [req("a", tolerations=tol), req("b", tolerations=tol)], [{"matchAttribute": f"{DRIVER}/numa"}]
    )
    assert sorted(p.cand.device["name"] for p in a.allocate_on_node("n", [two])[0]) == ["gpu-1", "gpu-2"]
    sub = [
        {"name": "big", "deviceClassName": DRIVER, "count": 5},
        {"name": "one", "deviceClassName": DRIVER, "count": 1},
    ]
    [[p]] = a.allocate_on_node("n", [claim("c", [req(first=sub)])])
    assert p.slot.request == "gpu/one"
    with pytest.raises(Exception, match="no such member"):
        a.allocate_on_node("n", [claim("c", [req(selectors=['device.attributes["gpu.hami.io"].nope == 1'])])])
