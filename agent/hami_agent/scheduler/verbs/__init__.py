"""The extender verbs, HTTP-free: /filter (``extender``: decide, reserve, write the assignment), /bind
(``binder``: node lock, binding, lost answers), the wait for a busy node lock, write-behind, requeue of
refused pods, the verbs' arguments, leadership (fencing, forwarding) and events.

May import: ``scheduler.core``, ``scheduler.state``, ``hami_agent.protocol``, ``hami_agent.k8s``,
``hami_agent.httpserve`` (the forwarding client). Not ``scheduler.serve``.
"""
