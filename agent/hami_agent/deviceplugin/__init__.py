"""Kubelet device plugin (API v1beta1) for NVIDIA GPUs, wire-compatible with HAMi.

Modules: ``settings`` (typed options), ``devices`` (snapshot -> advertised resources and device IDs),
``health`` (Unhealthy/recovery rules), ``allocator`` (GetPreferredAllocation/Allocate logic, pure),
``podsource`` (where pods come from: informer cache + short API calls), ``server`` (one gRPC server per
resource, deadline-bounded handlers), ``kubelet_registration`` (Register with the kubelet, retry/backoff),
``node_register`` (the ``hami.io/node-nvidia-register`` node annotation loop), ``manager`` (lifecycle:
re-registration, pause, crash limit), ``metrics``/``httpserver`` (/metrics, /healthz), ``cmd``
(``hami-agent device-plugin``).
"""
