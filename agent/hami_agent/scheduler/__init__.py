"""HAMi-compatible scheduler extender and admission webhook (``hami-agent scheduler``).

HAMi's rules for requests, annotations, quantities, reasons, handshake and pair scores live in
``hami_agent.protocol`` (pure) and ``hami_agent.config``; this package uses them and adds the fit,
scoring, caching and serving around them.

Modules, one job each:
  model     device/node/pod usage dataclasses used by the fit code and the cache
  requests  a pod's shape check and its requests as hashable memo keys (semantics:
            hami_agent.protocol.requests)
  args      request bodies: type-checked identity and node names (BadRequest names the field)
  fit       HAMi's Fit / fitInDevices / device and node scoring (pure)
  cache     usage cache: nodes + pods (with assumptions), free capacity, fit-set memo
  podinfo   which pods' allocations count, and their per-GPU usage
  podstate  the pod state /filter and /bind trust (informer or GET, uid-matched) and who may be decided for
  nodes     register annotation + handshake rules for one node
  dra       registered GPUs assigned to the DRA driver (config ``dra:``) are left out
  extender  /filter logic (cache + API client + events); /bind delegates to binder
  binder    /bind: decision check, node lock, lost binding answers, lock healing
  decisions bounded record of recent /filter decisions (what /bind may bind)
  reconcile read-back of writes whose outcome is unknown; cache audit
  heal      the one background thread that retries repairs with backoff
  leadership leader gate: fencing, relist on takeover, forwarding to the leader
  webhook   AdmissionReview mutation
  server    threaded HTTP server: routes, limits, TLS, metrics, profiling
  sync      informer wiring and the periodic node register loop
  app       wiring of one scheduler process
  cmd       the ``hami-agent scheduler`` subcommand
"""
