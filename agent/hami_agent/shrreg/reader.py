"""Read-only decoding of shared-region files, bounded against hostile ones.

Snapshots are taken with ``pread`` on an ``O_RDONLY`` descriptor rather than by copying out of an
mmap: both read the same page cache that the CUDA processes' ``MAP_SHARED`` mappings write, but a
region truncated under a live mapping (``shrreg-tool --create_new`` does ``O_TRUNC``) raises SIGBUS
in the reader, which would kill a long-running monitor. ``pread`` just returns fewer bytes, which we
report as a truncated file. The repair path (``repair.py``) does mmap, because it must operate on
the live semaphores (it maps in a child process for that reason).

The file is the tenant's (mapped read-write in its container), so: it is opened with
``safeopen.open_regular`` (no symlinks below the root, no FIFO/device, no blocking ``open``); a header
no real region can have (``proc_num``/``device_num`` out of range) marks the region ``corrupt`` without
decoding its slots; and the seqlock retries of one file share one deadline (``READ_DEADLINE_S``), so a
body full of odd sequence counters costs at most that long, not 1024 slots x 20 retries.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from hami_agent.shrreg.layout import (
    MAX_DEVICES,
    MAX_PROCS,
    UUID_LEN,
    V11,
    V11_TRAILER,
    Layout,
    RegionFormatError,
    detect_layout,
)
from hami_agent.shrreg.model import DeviceMemory, DeviceUtil, ProcSlot, Region, SemState
from hami_agent.shrreg.safeopen import open_regular

DEFAULT_HOOK_PATH = "/usr/local"
CACHE_SUFFIX = ".cache"
SEQLOCK_RETRIES = 20  # per slot, as HAMi-core's readers; all retries of one file share READ_DEADLINE_S
READ_DEADLINE_S = 0.25  # a writer holds a slot's seqlock odd for microseconds; a slot odd for longer
#                         than this is a dead writer (or a forged file), reported as "update in progress"
MAX_FILES_PER_CONTAINER = 16  # HAMi-core writes one region per container; more is a tenant's doing


def postinit_offset(layout: Layout) -> int | None:
    """Offset of sem_postinit; on v1.1 files the same bytes are the trailer a v1.2 library uses."""
    if layout.off_sem_postinit is not None:
        return layout.off_sem_postinit
    return V11_TRAILER if layout.name == V11 else None


def decode_sem(buf: bytes | memoryview, off: int) -> SemState:
    data, private = struct.unpack_from("<Qi", buf, off)
    return SemState(value=data & 0xFFFFFFFF, nwaiters=data >> 32, private=private)


def _decode_uuid(raw: bytes) -> str:
    raw = raw.split(b"\0", 1)[0]
    return raw.decode("ascii", errors="replace")


def decode_slot(layout: Layout, buf: bytes | memoryview, index: int, base: int | None = None) -> ProcSlot:
    off = layout.slot_offset(index) if base is None else base
    vals = layout.slot_struct().unpack_from(buf, off)
    pos = 0
    pid, hostpid = vals[0], vals[1]
    pos = 2
    seqlock = None
    if layout.s_seqlock == 8:
        seqlock = vals[pos]
        pos += 1
    wm = layout.s_used_stride // 8
    used = []
    for _ in range(MAX_DEVICES):
        c, m, d, o, t = vals[pos : pos + 5]
        used.append(DeviceMemory(context_size=c, module_size=m, data_size=d, offset=o, total=t))
        pos += wm
    monitorused = tuple(vals[pos : pos + MAX_DEVICES])
    pos += MAX_DEVICES
    wu = layout.s_util_stride // 8
    utils = []
    for _ in range(MAX_DEVICES):
        de, en, sm = vals[pos : pos + 3]
        utils.append(DeviceUtil(dec_util=de, enc_util=en, sm_util=sm))
        pos += wu
    status = vals[pos]
    pos += 1
    if layout.s_seqlock is not None and layout.s_seqlock > 8:
        seqlock = vals[pos]
    return ProcSlot(
        index=index,
        pid=pid,
        hostpid=hostpid,
        used=tuple(used),
        monitorused=monitorused,
        device_util=tuple(utils),
        status=status,
        seqlock=seqlock,
    )


def decode_region(
    buf: bytes | memoryview, file_size: int, path: str = "<region>", slot_reader=None,
    deadline: float | None = None,
) -> Region:
    """Decode a region from ``buf`` (at least the layout's size). Raises RegionFormatError.

    ``slot_reader(index) -> bytes`` (optional) re-reads one slot's bytes for seqlock retries, which stop
    at ``deadline`` (``time.monotonic()``; default: ``READ_DEADLINE_S`` from now) for the whole region.
    """
    if deadline is None:
        deadline = time.monotonic() + READ_DEADLINE_S
    layout, major, minor = detect_layout(file_size, bytes(buf[:12]), path)
    if len(buf) < layout.size:
        raise RegionFormatError(
            f"{path}: read {len(buf)} bytes but layout {layout.name} needs {layout.size}: the file shrank "
            "while being read (truncated or re-created)"
        )
    warnings: list[str] = []
    corrupt = False
    if major == 1 and minor not in (1, 2):
        warnings.append(f"unknown minor version {major}.{minor}: decoded with the v1.2 layout")
    (flag,) = struct.unpack_from("<i", buf, 0)
    (sm_init_flag,) = struct.unpack_from("<i", buf, layout.off_sm_init_flag)
    (owner_pid,) = struct.unpack_from("<Q", buf, layout.off_owner_pid)
    sem = decode_sem(buf, layout.off_sem)
    pi = postinit_offset(layout)
    sem_postinit = decode_sem(buf, pi) if pi is not None else None
    (device_num,) = struct.unpack_from("<Q", buf, layout.off_device_num)
    if device_num > MAX_DEVICES:
        warnings.append(f"device_num {device_num} is out of range 0..{MAX_DEVICES}: region is corrupt")
        corrupt = True
    uuids = tuple(
        _decode_uuid(bytes(buf[layout.off_uuids + UUID_LEN * i : layout.off_uuids + UUID_LEN * (i + 1)]))
        for i in range(MAX_DEVICES)
    )
    limit = struct.unpack_from(f"<{MAX_DEVICES}Q", buf, layout.off_limit)
    sm_limit = struct.unpack_from(f"<{MAX_DEVICES}Q", buf, layout.off_sm_limit)
    proc_num, util_switch, recent_kernel, priority = struct.unpack_from("<iiii", buf, layout.off_proc_num)
    if not 0 <= proc_num <= MAX_PROCS:
        warnings.append(f"proc_num {proc_num} is out of range 0..{MAX_PROCS}: region is corrupt")
        corrupt = True
    n = 0 if corrupt else proc_num  # a corrupt header's slots are noise: not decoded
    procs = []
    for i in range(n):
        slot = decode_slot(layout, buf, i)
        tries = 0
        # Seqlock readers retry while a writer is mid-update, exactly as get_gpu_memory_usage does;
        # give up after a bounded number of re-reads (or at the file's deadline) and report the slot as
        # in progress.
        while (slot.write_in_progress and slot_reader is not None and tries < SEQLOCK_RETRIES
               and time.monotonic() < deadline):
            tries += 1
            time.sleep(0.0005 * tries)
            raw = slot_reader(i)
            if raw is None or len(raw) < layout.slot_size:
                break
            slot = decode_slot(layout, raw, i, base=0)
        procs.append(slot)
    last_kernel_time = None
    if layout.off_last_kernel_time is not None:
        (last_kernel_time,) = struct.unpack_from("<Q", buf, layout.off_last_kernel_time)
    return Region(
        path=path,
        file_size=file_size,
        layout=layout.name,
        major=major,
        minor=minor,
        initialized_flag=flag,
        sm_init_flag=sm_init_flag,
        owner_pid=owner_pid,
        sem=sem,
        sem_postinit=sem_postinit,
        device_num=device_num,
        uuids=uuids,
        limit=tuple(limit),
        sm_limit=tuple(sm_limit),
        proc_num=proc_num,
        procs=tuple(procs),
        utilization_switch=util_switch,
        recent_kernel=recent_kernel,
        priority=priority,
        last_kernel_time=last_kernel_time,
        warnings=tuple(warnings),
        corrupt=corrupt,
    )


def read_region(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                deadline_s: float = READ_DEADLINE_S) -> Region:
    """Snapshot and decode one region file within ``deadline_s``. Never writes, never follows a symlink
    below ``root`` (default: the file's directory), never opens a FIFO or device. Raises
    RegionFormatError, ``safeopen.RefusedFile`` or another OSError."""
    p = os.fspath(path)
    deadline = time.monotonic() + deadline_s
    fd = open_regular(p, os.fspath(root) if root is not None else None)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 12, 0)
        layout, _, _ = detect_layout(size, head, p)
        buf = os.pread(fd, layout.size, 0)

        def slot_reader(i: int) -> bytes:
            return os.pread(fd, layout.slot_size, layout.slot_offset(i))

        return decode_region(buf, size, p, slot_reader=slot_reader, deadline=deadline)
    finally:
        os.close(fd)


def default_root(hook_path: str | None = None) -> str:
    """Host directory holding one ``<podUID>_<container>`` directory per container.

    ``hook_path`` (else env ``HOOK_PATH``, else ``/usr/local``) follows the agent and HAMi's device
    plugin: files live under ``<hook>/vgpu``. HAMi's vGPU monitor chart instead sets
    ``HOOK_PATH=/usr/local/vgpu``; a value ending in ``/vgpu`` is accepted as that directory itself.
    """
    hook = (hook_path or os.environ.get("HOOK_PATH") or DEFAULT_HOOK_PATH).rstrip("/") or "/"
    vgpu = hook if hook.endswith("/vgpu") else os.path.join(hook, "vgpu")
    return os.path.join(vgpu, "containers")


def resolve_root(directory: str | None, config_path: str | None = None, node_name: str | None = None) -> str:
    """``--dir`` if given, else the hook path from ``--config`` (agent config), else ``default_root()``."""
    if directory:
        return directory
    if config_path:
        from hami_agent.config import load_config

        return default_root(load_config(config_path, node_name).agent.hook_path)
    return default_root()


def find_region_files(root: str | os.PathLike[str],
                      max_per_container: int = MAX_FILES_PER_CONTAINER) -> Iterator[Path]:
    """Region files under ``root``: ``root/<podUID>_<ctr>/*.cache`` (sorted), or ``root`` itself.

    ``root`` may also be a single container directory (``*.cache`` directly inside it). Symlinked
    container directories are not followed; ``*.cache`` entries that are not regular files (symlinks,
    FIFOs, devices) ARE listed, so the reader refuses and reports them. At most ``max_per_container``
    files per directory (a tenant can create any number). Unreadable or vanished directories are
    skipped: containers come and go while we scan.
    """
    rootp = Path(root)
    try:
        if rootp.is_file():
            yield rootp
            return
        with os.scandir(rootp) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    own: list[Path] = []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _cache_files(Path(entry.path), max_per_container)
            elif entry.name.endswith(CACHE_SUFFIX) and len(own) < max_per_container:
                own.append(Path(entry.path))
        except OSError:
            continue
    yield from own


def _cache_files(directory: Path, limit: int) -> list[Path]:
    found: list[str] = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                if e.name.endswith(CACHE_SUFFIX) and not e.is_dir(follow_symlinks=False):
                    found.append(e.name)
                    if len(found) > limit:  # stop listing: a tenant may have created millions
                        break
    except OSError:
        return []
    return [directory / name for name in sorted(found)[:limit]]


def container_identity(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(podUID, container)`` from the cache directory name ``<podUID>_<container>``.

    Pod UIDs are RFC 4122 UUIDs (no '_'), container names are DNS labels (no '_'), so the first '_'
    splits them unambiguously.
    """
    name = Path(path).parent.name
    uid, sep, ctr = name.partition("_")
    if not sep or not uid or not ctr:
        return None
    return uid, ctr
