"""NVML access for hami-agent: inventory model, supervised NVML worker process, XID health.

Import-light on purpose (no pynvml here): pynvml is only imported inside the worker process.
"""

from hami_agent.nvml.client import NvmlClient, collect_inventory, collect_usage
from hami_agent.nvml.errors import NvmlError, NvmlStuckUnkillable, NvmlTimeout
from hami_agent.nvml.health import DEFAULT_IGNORED_XIDS, XidPolicy
from hami_agent.nvml.model import Gpu, MigDevice, Snapshot, device_type, mig_profile_name
from hami_agent.nvml.reaper import WorkerReaper, default_reaper
from hami_agent.nvml.supervisor import NvmlSupervisor
from hami_agent.nvml.usage import GpuUsage, ProcessUsage, Usage

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "Gpu",
    "GpuUsage",
    "MigDevice",
    "NvmlClient",
    "NvmlError",
    "NvmlStuckUnkillable",
    "NvmlSupervisor",
    "NvmlTimeout",
    "ProcessUsage",
    "Snapshot",
    "Usage",
    "WorkerReaper",
    "XidPolicy",
    "collect_inventory",
    "collect_usage",
    "default_reaper",
    "device_type",
    "mig_profile_name",
]
