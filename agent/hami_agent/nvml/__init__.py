"""NVML access for hami-agent: inventory model, supervised NVML worker process, XID health.

Import-light on purpose (no pynvml here): pynvml is only imported inside the worker process.
"""

from hami_agent.nvml.errors import NvmlError, NvmlTimeout
from hami_agent.nvml.health import DEFAULT_IGNORED_XIDS, XidPolicy
from hami_agent.nvml.inventory import collect_inventory
from hami_agent.nvml.model import Gpu, MigDevice, Snapshot, device_type, mig_profile_name
from hami_agent.nvml.supervisor import NvmlSupervisor

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "Gpu",
    "MigDevice",
    "NvmlError",
    "NvmlSupervisor",
    "NvmlTimeout",
    "Snapshot",
    "XidPolicy",
    "collect_inventory",
    "device_type",
    "mig_profile_name",
]
