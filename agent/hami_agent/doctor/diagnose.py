"""Run collectors for a target, evaluate the trees, and fall back to UNKNOWN (never a guess)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hami_agent.doctor import predicates
from hami_agent.doctor.collect import host, kube
from hami_agent.doctor.collect.base import Collector, Context, run_collector
from hami_agent.doctor.engine import Tree, evaluate, rank
from hami_agent.doctor.model import WARNING, Facts, Report, Verdict
from hami_agent.doctor.trees import TREES

UNKNOWN = "UNKNOWN"
# Collectors whose failure leaves the question unanswered (-> UNKNOWN when nothing else is found). The
# others (journal, NVML probe, files on the node) are best effort: their failure is listed, not a verdict.
REQUIRED = frozenset({"pod", "node", "cluster_list", "kubelet_log_file", "plugin_log", "hami_core_log"})


def _context_facts(ctx: Context, facts: Facts, node: str | None) -> None:
    facts.set("target.node", node or "<node>")
    facts.set("ctx.pending_after_s", ctx.pending_after_s)
    facts.set("ctx.handshake_timeout_s", ctx.handshake_timeout_s)
    facts.set("ctx.stall_after_s", ctx.stall_after_s)


def local_collectors(ctx: Context, local: bool) -> list[tuple[str, Collector, float | None]]:
    """Node-local evidence: on the node itself (``local``) or from files given on the command line."""
    if not (local or ctx.kubelet_log or ctx.plugin_log or ctx.hami_core_log or ctx.plugin_url):
        return []  # ``doctor cluster`` on every node but its own: no need to import the collectors
    # imported here (urllib.request, the NVML reaper: ~0.1 s of start-up that doctor cluster need not pay)
    from hami_agent.doctor.collect import endpoints, logs, nvmlworkers

    out: list[tuple[str, Collector, float | None]] = []
    if ctx.kubelet_log:
        out.append(("kubelet_log_file", logs.collect_kubelet_log, logs.log_timeout(ctx, ctx.kubelet_log)))
    elif local and ctx.use_journal:
        out.append(("kubelet_journal", logs.collect_kubelet_log, ctx.journal_timeout_s + 10))
    if ctx.plugin_log:
        out.append(("plugin_log", logs.collect_plugin_log, logs.log_timeout(ctx, ctx.plugin_log)))
    if ctx.hami_core_log:
        out.append(("hami_core_log", logs.collect_hami_core_log, logs.log_timeout(ctx, ctx.hami_core_log)))
    if ctx.plugin_url:
        out.append(("plugin_endpoint", endpoints.collect_plugin_endpoint, ctx.http_timeout_s * 2 + 5))
    if local:
        out.append(("driver_files", host.collect_driver_files, None))
        out.append(("nvml_workers", nvmlworkers.collect_nvml_workers, None))
        if ctx.nvml:
            out.append(("nvml", host.collect_nvml, ctx.nvml_timeout_s + 10))
        out.append(("mps", host.collect_mps, None))
        out.append(("hami_core_files", host.collect_hami_core_files, None))
        out.append(("shrreg", host.collect_shrreg, None))
    return out


def _run(name_fns: Sequence[tuple[str, Collector, float | None]], ctx: Context, facts: Facts,
         report: Report) -> None:
    for name, fn, timeout in name_fns:
        # with the cluster view (doctor cluster) the node and pod collectors only read memory
        inline = ctx.view is not None and fn in (kube.collect_node, kube.collect_pod)
        report.collectors.append(run_collector(name, fn, ctx, facts, timeout, inline=inline))


def finish(report: Report, facts: Facts, trees: Sequence[Tree] = TREES,
           symptoms: Sequence[str] = ()) -> Report:
    hosts = facts.get("kubelet.log.hosts", None)
    if facts.get("target.node", None) in (None, "<node>") and hosts and len(hosts) == 1:
        facts.set("target.node", hosts[0])  # the journald prefix names the node
    host.derive_driver_facts(facts)
    verdicts = evaluate(trees, facts, predicates.REGISTRY)
    failed = [c.error for c in report.collectors if not c.ok and c.error and c.name in REQUIRED]
    problems = [v for v in verdicts if v.is_problem]
    if not problems and (symptoms or failed):
        verdicts.append(unknown_verdict(list(symptoms), failed, facts))
    report.verdicts = rank(verdicts)
    report.facts = facts.to_dict()
    return report


def unknown_verdict(symptoms: list[str], failed: list[str], facts: Facts) -> Verdict:
    lines = symptoms + failed
    for key in ("events.count", "pod.scheduled_condition", "node.register.present", "node.handshake.kind",
                "kubelet.outstanding"):
        lines.extend(facts.lines(key))
    if symptoms:
        summary = ("something is wrong but no decision tree matches the evidence"
                   + (" (some evidence could not be collected)" if failed else ""))
    else:  # nothing is known to be wrong, and nothing is known to be right: say what could not be read
        summary = "no verdict: required evidence could not be read (" + "; ".join(failed) + ")"
    return Verdict(
        code=UNKNOWN, severity=WARNING,
        summary=summary,
        evidence=list(dict.fromkeys(lines)),
        fix="collect everything for a human: ansible-playbook playbooks/collect_diagnostics.yml -l "
            f"{facts.get('target.node', '<node>')}; re-run with --kubelet-log/--plugin-log/--scheduler-url "
            "for more evidence",
        tree="none", runbook=f"docs/runbooks/{UNKNOWN}.md",
    )


def _pod_symptoms(facts: Facts) -> list[str]:
    reg = predicates.REGISTRY
    out = []
    if reg.evaluate("pod_pending_long", facts):
        out.append(f"pod {facts.get('pod.ref')} has been Pending for {facts.get('pod.age_s', 0):.0f}s")
    if reg.evaluate("binding_failed", facts):
        out.append(f"pod {facts.get('pod.ref')} failed to bind")
    if facts.get("pod.terminating") is True:
        out.append(f"pod {facts.get('pod.ref')} is Terminating")
    return out


def is_local(ctx: Context, node: str | None) -> bool:
    """True when ``node`` is the machine this command runs on."""
    import socket

    return bool(node) and node in {ctx.self_node, socket.gethostname()}


def diagnose_pod(ctx: Context, local: bool | None = False) -> Report:
    facts = Facts()
    report = Report("pod", f"{ctx.pod_ns}/{ctx.pod_name}")
    _run([("pod", kube.collect_pod, None)], ctx, facts, report)
    if ctx.scheduler_url:
        _run([("scheduler_endpoint", _endpoints().collect_scheduler_endpoint, ctx.http_timeout_s * 2 + 5)],
             ctx, facts, report)
    node = facts.get("pod.node_name", None) or facts.get("pod.vgpu_node", None)
    if node:
        ctx.node_name = node
        _run([("node", kube.collect_node, None)], ctx, facts, report)
    _context_facts(ctx, facts, node)
    if local is None:
        local = is_local(ctx, node)
    _run(local_collectors(ctx, local), ctx, facts, report)
    return finish(report, facts, symptoms=_pod_symptoms(facts))


def diagnose_node(ctx: Context, local: bool | None = False) -> Report:
    facts = Facts()
    if local is None:
        local = is_local(ctx, ctx.node_name)
    report = Report("node", ctx.node_name or "")
    _context_facts(ctx, facts, ctx.node_name)
    collectors: list[tuple[str, Collector, float | None]] = [("node", kube.collect_node, None)]
    if ctx.scheduler_url:
        collectors.append(("scheduler_endpoint", _endpoints().collect_scheduler_endpoint,
                           ctx.http_timeout_s * 2 + 5))
    _run(collectors + local_collectors(ctx, local), ctx, facts, report)
    symptoms = facts.lines("kubelet.outstanding")
    return finish(report, facts, symptoms=symptoms)


def diagnose_logs(ctx: Context) -> Report:
    facts = Facts()
    report = Report("logs", ", ".join(p for p in (ctx.kubelet_log, ctx.plugin_log, ctx.hami_core_log) if p))
    _context_facts(ctx, facts, ctx.node_name)
    _run(local_collectors(ctx, local=False), ctx, facts, report)
    return finish(report, facts, symptoms=facts.lines("kubelet.outstanding"))


def diagnose_cluster(ctx: Context, local_node: str | None = None, max_pods: int = 50) -> Report:
    """Every node (API evidence), plus pending pods that request HAMi resources; findings ranked."""
    report = Report("cluster", ctx.client.host if ctx.client is not None else "")
    facts = Facts()
    box: dict[str, list] = {}

    def list_all(c: Context, f: Facts) -> None:
        view = kube.list_cluster(c.client)  # three paginated lists, whatever the cluster's size
        box["view"] = [view]
        box["nodes"] = list(view.nodes.values())
        box["pods"] = view.pending_pods()

    _run([("cluster_list", list_all, None)], ctx, facts, report)
    # one verdict about the cluster itself: is the allocation guard installed (ALLOCATION_GUARD_MISSING)?
    _run([("admission_guard", kube.collect_admission_guard, None)], ctx, facts, report)
    if box.get("view"):
        ctx = _sub_context(ctx, view=box["view"][0])
    if ctx.scheduler_url:
        _run([("scheduler_endpoint", _endpoints().collect_scheduler_endpoint, ctx.http_timeout_s * 2 + 5)],
             ctx, facts, report)
    for node in box.get("nodes", []):
        name = (node.get("metadata") or {}).get("name", "")
        ann = (node.get("metadata") or {}).get("annotations") or {}
        gpus = str(((node.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu", "0"))
        if not any(k.startswith("hami.io/") for k in ann) and gpus in ("", "0"):
            continue  # not a GPU node: nothing for HAMi to diagnose
        local = name == local_node
        sub = _sub_context(ctx, node_name=name)
        if not local:
            # --plugin-url and the log files describe the node doctor runs on: applying them to every
            # node would pin one node's NVML hang on all of them.
            sub = _sub_context(sub, plugin_url=None, plugin_log=None, kubelet_log=None, hami_core_log=None)
        report.children.append(diagnose_node(sub, local=local))
    pending = 0
    for pod in box.get("pods", []):
        if pending >= max_pods:
            break
        meta = pod.get("metadata") or {}
        from hami_agent.protocol.requests import pod_requests_gpu

        if not pod_requests_gpu(pod):
            continue
        pending += 1
        sub = _sub_context(ctx, pod_ns=meta.get("namespace"), pod_name=meta.get("name"))
        sub.scheduler_url = None  # checked once above
        report.children.append(diagnose_pod(sub))
    _context_facts(ctx, facts, None)
    finish(report, facts)
    merged = list(report.verdicts)
    for child in report.children:
        for v in child.verdicts:
            subject = v.subject or f"{child.command} {child.target}"
            merged.append(replace(v, subject=subject, evidence=list(v.evidence)))
    report.verdicts = rank(merged)
    return report


def _endpoints():  # the module, imported when a --scheduler-url is given (urllib.request: ~40 ms)
    from hami_agent.doctor.collect import endpoints

    return endpoints


def _sub_context(ctx: Context, **changes: object) -> Context:
    return replace(ctx, **changes)  # type: ignore[arg-type]
