"""The hami.node sandbox: a SIMULATED GPU cluster on one machine (``python -m sandbox up|down|status|demo``).

See docs/sandbox.md. Real parts: the agent (device plugin, scheduler extender, doctor), the playbooks and
roles, podman containers with systemd, apt. Simulated parts: the GPUs (gpusim), the NVIDIA packages
(a local dummy apt repo), the Kubernetes API server, kube-scheduler and the kubelets (tests/sim/).
"""
