"""HAMi-compatible scheduler extender and admission webhook (``hami-agent scheduler``).

HAMi's rules for requests, annotations, quantities, reasons, handshake and pair scores live in
``hami_agent.protocol`` (pure) and ``hami_agent.config``; this package uses them and adds the fit,
scoring, caching and serving around them.

Modules, one job each:
  model     device/node/pod usage dataclasses used by the fit code and the cache
  requests  a pod's requests as hashable memo keys (semantics: hami_agent.protocol.requests)
  fit       HAMi's Fit / fitInDevices / device and node scoring (pure)
  cache     usage cache: nodes + pods, incrementally maintained free capacity, fit-set memo
  nodes     register annotation + handshake rules for one node
  extender  /filter and /bind logic (cache + API client + events)
  webhook   AdmissionReview mutation
  server    threaded HTTP server: routes, limits, TLS, metrics, profiling
  sync      informer wiring and the periodic node register loop
  cmd       the ``hami-agent scheduler`` subcommand
"""
