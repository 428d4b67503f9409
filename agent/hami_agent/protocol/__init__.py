"""HAMi wire formats (Project-HAMi/HAMi ``pkg/device/devices.go``, ``pkg/device/nvidia/device.go``,
``pkg/util/``). Pure functions, no I/O, imports nothing else of ours.

Stable public names (other packages import them from here): ``NodeDevice``, ``ContainerDevice``,
``encode_node_devices``, ``decode_node_devices``, ``encode_pod_devices``, ``decode_pod_devices``,
``gen_reason``, ``parse_reason``, ``ProtocolError``; submodules ``keys``, ``nodelock``, ``handshake``,
``requests``, ``reasons``, ``annotations``.
"""

from hami_agent.protocol import keys
from hami_agent.protocol.annotations import (
    ScoringWeights,
    check_type,
    check_uuid,
    gpu_scheduler_policy,
    mode_matches,
    node_scheduler_policy,
    numa_bind,
    parse_device_cordon,
    parse_scoring_weights,
)
from hami_agent.protocol.devices import (
    ContainerDevice,
    MigPlacement,
    MigProfile,
    NodeDevice,
    decode_node_devices,
    decode_pod_devices,
    encode_container_devices,
    encode_node_devices,
    encode_node_devices_legacy,
    encode_pod_devices,
    pod_devices_remaining,
)
from hami_agent.protocol.errors import ProtocolError
from hami_agent.protocol.handshake import Handshake, format_requesting, is_requesting, parse_handshake
from hami_agent.protocol.nodelock import NodeLockValue, format_lock_value, parse_lock_value
from hami_agent.protocol.reasons import ALL_REASONS, gen_reason, parse_reason
from hami_agent.protocol.requests import (
    PERCENTAGE_UNSET,
    ContainerRequest,
    RequestConfig,
    container_requests,
    webhook_resource_defaults,
)

__all__ = [
    "ALL_REASONS", "PERCENTAGE_UNSET", "ContainerDevice", "ContainerRequest", "Handshake", "MigPlacement",
    "MigProfile", "NodeDevice", "NodeLockValue", "ProtocolError", "RequestConfig", "ScoringWeights",
    "check_type", "check_uuid", "container_requests", "decode_node_devices", "decode_pod_devices",
    "encode_container_devices", "encode_node_devices", "encode_node_devices_legacy", "encode_pod_devices",
    "format_lock_value", "format_requesting", "gen_reason", "gpu_scheduler_policy", "is_requesting", "keys",
    "mode_matches", "node_scheduler_policy", "numa_bind", "parse_device_cordon", "parse_handshake",
    "parse_lock_value", "parse_reason", "parse_scoring_weights", "pod_devices_remaining",
    "webhook_resource_defaults",
]
