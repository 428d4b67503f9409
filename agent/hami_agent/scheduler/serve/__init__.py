"""The HTTP face: listeners and routes for kube-scheduler's verbs and the public webhook (kept apart),
request shapes, the admission webhook and allocation guard, who may call, metrics, profiling, GC tuning,
the process wiring (``app``) and the ``hami-agent scheduler`` command (``cmd``).

May import everything above it: ``scheduler.core``, ``scheduler.state``, ``scheduler.verbs``,
``hami_agent.httpserve``, ``hami_agent.k8s``.
"""
