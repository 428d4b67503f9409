"""HAMi-core shared region (``cudevshr.cache``): layouts, read-only decoding, safe repair, analysis.

Public API::

    read_region(path) -> Region            # raises RegionFormatError / OSError, never writes
    decode_region(buf, file_size, path)    # pure: bytes -> Region
    detect_layout(file_size, head, path)   # -> (Layout, major, minor)
    force_unlock(path, dry_run=False) / cleanup(path, dry_run=False) -> RepairResult
    analyse_region(region, attachment=None, nvml=None) -> list[Finding]
    scan_attachment(path) -> Attachment    # which processes have the region mapped (liveness)
"""

from hami_agent.shrreg.analysis import Finding, NvmlProcess, analyse_region
from hami_agent.shrreg.layout import LAYOUTS, Layout, RegionFormatError, detect_layout
from hami_agent.shrreg.liveness import Attachment, scan_attachment, scan_attachments
from hami_agent.shrreg.model import DeviceMemory, DeviceUtil, ProcSlot, Region, SemState
from hami_agent.shrreg.reader import (
    container_identity,
    decode_region,
    default_root,
    find_region_files,
    read_region,
)
from hami_agent.shrreg.repair import RepairResult, cleanup, force_unlock

__all__ = [
    "LAYOUTS",
    "Attachment",
    "DeviceMemory",
    "DeviceUtil",
    "Finding",
    "Layout",
    "NvmlProcess",
    "ProcSlot",
    "Region",
    "RegionFormatError",
    "RepairResult",
    "SemState",
    "analyse_region",
    "cleanup",
    "container_identity",
    "decode_region",
    "default_root",
    "detect_layout",
    "find_region_files",
    "force_unlock",
    "read_region",
    "scan_attachment",
    "scan_attachments",
]
