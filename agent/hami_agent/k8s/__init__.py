"""The only code that talks to the Kubernetes API (official ``kubernetes`` client; dicts in, dicts out).

Import-light: the ``kubernetes`` package itself is imported only when a client is built.
"""

from hami_agent.k8s.client import KubeClient, RetryPolicy, WatchStream
from hami_agent.k8s.errors import (
    ConflictError,
    ExpiredError,
    KubeConfigError,
    KubeError,
    KubeTimeoutError,
    NotFoundError,
    ThrottledError,
)
from hami_agent.k8s.informer import Informer
from hami_agent.k8s.leader import LeaderElector
from hami_agent.k8s.nodelock import NodeLockError, lock_node, release_node_lock

__all__ = [
    "ConflictError",
    "ExpiredError",
    "Informer",
    "KubeClient",
    "KubeConfigError",
    "KubeError",
    "KubeTimeoutError",
    "LeaderElector",
    "NodeLockError",
    "NotFoundError",
    "RetryPolicy",
    "ThrottledError",
    "WatchStream",
    "lock_node",
    "release_node_lock",
]
