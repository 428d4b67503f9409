"""HAMi-compatible scheduler extender and admission webhook (``hami-agent scheduler``).

HAMi's rules for requests, annotations, quantities, reasons, handshake and pair scores live in
``hami_agent.protocol`` (pure) and ``hami_agent.config``; this package uses them and adds the fit,
scoring, caching and serving around them. Four sub-packages, each importing only the ones above it
(``tests/unit/test_import_graph.py`` holds them to it):

  core   the pure decision: a pod's request, HAMi's Fit and scores, MIG placement, the pre-checks, a node's
         devices from its register annotation; ``core.decide`` answers one request from a snapshot. Imports
         nothing of Kubernetes, HTTP or threads (protocol and config only).
  state  what the extender knows of the cluster: the usage cache (nodes, pods, assumptions, memo), which
         pods count, informer wiring, read-backs, the decision record, busy nodes, repairs.
  verbs  the extender verbs, HTTP-free: /filter's decision and write (``verbs.extender``), /bind's node lock
         and binding, the wait for a node lock, write-behind, requeue, request arguments, leadership, events.
  serve  the HTTP face: listeners and routes, the admission webhook and guard, who may call, metrics,
         profiling, the process wiring and the ``hami-agent scheduler`` command.
"""
