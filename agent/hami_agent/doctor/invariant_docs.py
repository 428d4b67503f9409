"""What each finding of the invariant checker (``doctor/invariants.py``) means to an operator, and the fix.

``python -m hami_agent.doctor.runbooks --write docs/runbooks`` renders one page per kind into
``docs/runbooks/invariants/``; a unit test keeps the pages and this table in step with the kinds
``invariants.check`` can report."""

from __future__ import annotations

from dataclasses import dataclass

API_ONLY = "from the API objects alone (`hami-agent doctor invariants`)"
WITH_RECORDS = ("only when the checker is given what Allocate handed out (the tests' kubelet simulator, or a "
                "node's container environments); not from the API alone")
WITH_CACHE = "only when the checker is given the scheduler's usage cache (the tests); not from the API alone"


@dataclass(frozen=True)
class KindDoc:
    title: str
    meaning: str  # what is wrong and why it matters
    causes: str
    fix: str
    found: str = API_ONLY


KIND_DOCS: dict[str, KindDoc] = {
    "overcommit-memory": KindDoc(
        "a GPU promised more memory than it has",
        "The pods bound to the node and not finished together hold more `nvidia.com/gpumem` on one GPU "
        "(their `hami.io/vgpu-devices-allocated`) than the GPU's `devmem` in the node's "
        "`hami.io/node-nvidia-register`. HAMi-core enforces each container's limit, so the sum is what the "
        "card must hold: the last allocations fail with CUDA out-of-memory.",
        "allocation annotations written by someone other than the scheduler (no admission policy), two "
        "scheduler replicas deciding at once, a register annotation that shrank (a GPU re-registered with "
        "less memory, a MIG change) under running pods.",
        "find who wrote the pods' annotations (the audit log; `hami-allocation-keys/writer` audit "
        "annotation, docs/security.md) and delete the pods that were not placed by the scheduler; with a "
        "shrunken register, drain the GPU's pods and let the scheduler place them again."),
    "overcommit-cores": KindDoc(
        "a GPU promised more cores than it has",
        "The bound pods' `nvidia.com/gpucores` on one GPU add up to more than its `devcore` (100): "
        "HAMi-core's SM limits then cannot all be met and pods run slower than they were promised.",
        "as for overcommit-memory.", "as for overcommit-memory."),
    "overcommit-slots": KindDoc(
        "more pods share a GPU than its split count",
        "More app containers use one GPU than the `count` (`deviceSplitCount`) the node registered for it.",
        "as for overcommit-memory; or `deviceSplitCount` lowered on the node while pods ran.",
        "as for overcommit-memory; after lowering the split count, drain the node's GPU pods."),
    "exclusive-shared": KindDoc(
        "an exclusive pod shares its GPU",
        "A pod that asked for a whole GPU (100 cores, the exclusive default) holds a GPU another bound pod "
        "holds as well: \"exclusive\" is not.",
        "as for overcommit-memory.", "as for overcommit-memory."),
    "unknown-device": KindDoc(
        "an allocation names a GPU the node did not register",
        "A bound pod's allocation names a GPU UUID that is not in its node's `hami.io/node-nvidia-register`: "
        "the GPU was removed or replaced, marked out by the device plugin's filters, or the UUID was written "
        "by hand.",
        "GPU replaced or fallen off the bus; `filterdevices` changed; forged annotations.",
        "check the node's GPUs (`hami-agent doctor node <node>`, `nvidia-smi -L`); delete the pod so the "
        "scheduler places it on a GPU that exists; forged annotations: as for overcommit-memory."),
    "bound-elsewhere": KindDoc(
        "a pod bound to another node than its allocation",
        "`spec.nodeName` differs from `hami.io/vgpu-node`: the scheduler's allocation is for a node the pod "
        "does not run on, so the devices it names there are counted nowhere and the pod's real node has no "
        "allocation for it.",
        "a bind that used another node than the extender's decision (another scheduler binding a pod the "
        "extender annotated), a pod re-created with copied annotations.",
        "delete the pod; its controller's new pod is scheduled again. If it recurs, check that only "
        "hami-scheduler (the extender's /bind) binds pods with `schedulerName: hami-scheduler`."),
    "allocated-not-bound": KindDoc(
        "bind-phase=success on a pod that is not bound",
        "`hami.io/bind-phase: success` says Allocate handed the pod its devices, yet the pod has no "
        "`spec.nodeName`: no kubelet can have admitted it.",
        "annotations copied into a new pod (a pod template that carries `hami.io/*`), or written by hand.",
        "remove HAMi's keys from the pod template; delete the pod."),
    "allocated-no-devices": KindDoc(
        "bind-phase=success but Allocate handed out nothing",
        "The pod says it was allocated but the record of what Allocate handed out has no devices for it.",
        "a success written after Allocate failed (the deadline path), or by hand.",
        "delete the pod so it is scheduled and allocated again; report it (the device plugin must never "
        "write success after an error answer).", WITH_RECORDS),
    "allocate-mismatch": KindDoc(
        "Allocate handed out other devices or limits than the allocation",
        "A container received GPUs, memory or SM limits other than its `hami.io/vgpu-devices-allocated` "
        "entry: the scheduler counts one thing, the container runs with another.",
        "a device plugin that matched the wrong pod (HAMi's \"oldest binding pod\" guess), a kubelet that "
        "chose other devices than the scheduler's.",
        "delete the pod; check the device plugin's version and its log for Allocate refusals (`hami-agent "
        "doctor logs --plugin ...`).", WITH_RECORDS),
    "stale-lock": KindDoc(
        "a node lock nobody will release",
        "`hami.io/mutex.lock` on the node is older than the lock expiry (5 min), does not parse, or names a "
        "pod that is gone, finished, bound elsewhere or already allocated. While it stands the node takes "
        "no new GPU pod (`node lock contention`) and the device plugin refuses Allocate for everyone.",
        "an Allocate that refused and wrote nothing (the lock then waits for the scheduler's lock audit, "
        "every 60 s), a scheduler that died between lock and bind, a pod deleted before admission.",
        "it heals by itself: the scheduler's leader releases such a lock at its next audit (within about "
        "a minute) and any lock after 5 minutes; now: ansible-playbook playbooks/remediate_node_lock.yml -l "
        "<node> (or `kubectl annotate node <node> hami.io/mutex.lock-`)."),
    "cache-drift": KindDoc(
        "the scheduler's cache counts a pod differently from its annotations",
        "The extender's usage cache holds another node or other devices for a pod than its annotations "
        "say, or holds a pod that no longer exists: its next decisions over- or under-count those GPUs.",
        "a write whose answer was lost and not yet read back, an informer gap.",
        "the scheduler's audit reconciles unconfirmed entries within 5 minutes; restarting the extender "
        "(or a leader change) rebuilds the cache from the API.", WITH_CACHE),
    "undecodable-allocation": KindDoc(
        "a pod's allocation annotation does not decode",
        "`hami.io/vgpu-devices-allocated` of a pod with `hami.io/vgpu-node` is not a HAMi pod device string "
        "(`uuid,NVIDIA,memMiB,cores:` per device, `;` per container): the scheduler cannot count it and the "
        "device plugin refuses to allocate it.",
        "a scheduler and device plugin of different HAMi versions, or a hand-written annotation.",
        "run the same HAMi version for scheduler and plugin; delete the pod so it is scheduled again."),
}


def runbook_path(kind: str) -> str:
    return f"docs/runbooks/invariants/{kind}.md"


def render(kind: str) -> str:
    d = KIND_DOCS[kind]
    return "\n".join([
        f"# Invariant `{kind}`: {d.title}", "",
        f"Reported by the invariant checker (`hami-agent doctor invariants`, `kubectl hami doctor "
        f"invariants`, `hami_agent.doctor.invariants`) {d.found}.", "",
        "## What it means", "", d.meaning, "",
        "## Usual causes", "", d.causes, "",
        "## Fix", "", d.fix, "",
        "Check again: `hami-agent doctor invariants` no longer lists it (exit code 0).", ""])


__all__ = ["KIND_DOCS", "KindDoc", "render", "runbook_path"]
