"""The pure decision core: what a pod asks for, which GPUs of a node can give it (HAMi's Fit, scores, MIG
placement, the cheap pre-checks) and ``decide``, one answer from a snapshot of the nodes and a request.

May import: ``hami_agent.protocol``, ``hami_agent.config``, and modules of this package. Nothing of
Kubernetes clients, HTTP, threads or clocks: every function here is a function of its arguments.
"""
