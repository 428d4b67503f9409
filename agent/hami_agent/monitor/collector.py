"""Per-container vGPU metrics from HAMi-core shared regions, with HAMi vGPU monitor names and labels.

Names and labels follow HAMi's ``cmd/vGPUmonitor/metrics.go``: current names
(``hami_vgpu_memory_used_bytes``, ... labels ``namespace, pod, container, vdevice_index, device_uuid``)
and, with legacy metrics on, the names HAMi's Grafana dashboard queries
(``vGPU_device_memory_usage_in_bytes``, ``Device_memory_desc_of_container``, ... labels
``podnamespace, podname, ctrname, vdeviceid, deviceuuid``).
HAMi registers its collector under the constant label ``zone="vGPU"``; so do we.

Values follow HAMi's reading of the region: memory sums ``used[d].total`` over slots ``[0, proc_num)``
skipping exited (status 0) slots; utilisation sums ``sm_util``; the last-kernel metric is seconds since
``last_kernel_time`` (v1 layouts only, omitted when 0).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hami_agent import log
from hami_agent.shrreg.layout import RegionFormatError
from hami_agent.shrreg.model import Region
from hami_agent.shrreg.reader import container_identity, find_region_files, read_region

logger = logging.getLogger(__name__)

ZONE = "vGPU"
CTR_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid"]
LEGACY_CTR_LABELS = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"]
HOST_LABELS = ["node", "device_index", "device_uuid", "device_type"]
LEGACY_HOST_LABELS = ["nodeid", "deviceidx", "deviceuuid", "devicetype"]


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class HostGpuSample:
    """One physical GPU as NVML sees it (for HostGPUMemoryUsage / HostCoreUtilization)."""

    index: int
    uuid: str
    device_type: str  # HAMi labels it "NVIDIA-" + NVML name
    memory_used_bytes: int | None
    utilization: int | None


@dataclass
class ContainerRegion:
    path: str
    pod_uid: str
    container: str
    region: Region


@dataclass
class ScanResult:
    containers: list[ContainerRegion] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # path -> reason (this scan)
    taken_at: float = 0.0


PodResolver = Callable[[], dict[str, PodRef]]
# None: nothing to report this round (e.g. paused while the MIG apply lock is held). A source may also
# have ``status() -> (paused, abandoned, unkillable)`` (``monitor.hostgpu.HostGpuSource``): exported too.
HostSource = Callable[[], "list[HostGpuSample] | None"]


def scan(root: str) -> ScanResult:
    """Read every region under ``root``. Files that vanish or are half-written are reported, not fatal;
    corrupt and refused files (symlinks, FIFOs, devices) are reported and skipped, each read bounded by
    ``READ_DEADLINE_S`` so one hostile file cannot delay the others."""
    res = ScanResult(taken_at=time.time())
    for path in find_region_files(root):
        p = str(path)
        ident = container_identity(p)
        if ident is None:
            res.errors[p] = "directory name is not <podUID>_<container>"
            continue
        try:
            region = read_region(p, root=root)
        except FileNotFoundError:
            continue  # removed between listing and reading: the container is gone
        except (OSError, RegionFormatError) as exc:
            res.errors[p] = str(exc)
            continue
        if region.corrupt:
            why = "; ".join(w.removesuffix(": region is corrupt") for w in region.warnings)
            res.errors[p] = f"region is corrupt: {why}"
            continue
        res.containers.append(ContainerRegion(path=p, pod_uid=ident[0], container=ident[1], region=region))
    return res


# Reasons that mean someone wrote the file on purpose (or memory was trashed): logged as warnings, once.
HOSTILE_REASONS = frozenset({"corrupt", "refused"})


def error_reason(msg: str) -> str:
    if "region is corrupt" in msg:
        return "corrupt"
    if "refusing to" in msg or "replaced while being opened" in msg:
        return "refused"
    if "magic flag not set" in msg:
        return "not_initialised"
    if "magic flag not matched" in msg:
        return "bad_magic"
    if "size" in msg or "shrank" in msg or "too short" in msg:
        return "bad_size"
    if "version" in msg:
        return "unknown_version"
    if "directory name" in msg:
        return "bad_directory_name"
    return "io_error"


class RegionMonitor(Collector):
    """Prometheus collector over the latest scan; a background thread refreshes the scan."""

    def __init__(
        self,
        root: str,
        *,
        node_name: str = "",
        interval_s: float = 5.0,
        legacy: bool = True,
        pod_resolver: PodResolver | None = None,
        pod_refresh_s: float = 30.0,
        host_source: HostSource | None = None,
        host_max_age_s: float = 60.0,
    ):
        self.root = root
        self.node_name = node_name
        self.interval_s = interval_s
        self.legacy = legacy
        self.pod_resolver = pod_resolver
        self.pod_refresh_s = pod_refresh_s
        self.host_source = host_source
        self._lock = threading.Lock()
        self._scan = ScanResult()
        self._pods: dict[str, PodRef] = {}
        self._pods_at = 0.0
        self._scans_total = 0
        self._errors_total: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known_errors: dict[str, str] = {}
        self._host: list[HostGpuSample] | None = None
        self._host_error: str | None = None
        self.host_max_age_s = host_max_age_s
        self._host_at: float | None = None  # monotonic time of the last host sample
        self._scrapes: list[float] = []  # monotonic times of the last two scrapes
        self._clock = time.monotonic  # tests step it

    # -- scanning -------------------------------------------------------------------------------
    def refresh(self) -> ScanResult:
        res = scan(self.root)
        if self.pod_resolver is not None and time.monotonic() - self._pods_at >= self.pod_refresh_s:
            try:
                pods = self.pod_resolver()
                with self._lock:
                    self._pods = pods
                self._pods_at = time.monotonic()
            except Exception as exc:  # the API may be down; keep the last names, retry next round
                logger.warning("list pods for container names failed: %s", exc)
                self._pods_at = time.monotonic()
        with self._lock:  # published before NVML is asked: a slow or hung NVML must not delay it
            self._scan = res
            self._scans_total += 1
            for p, msg in res.errors.items():
                reason = error_reason(msg)
                self._errors_total[reason] = self._errors_total.get(reason, 0) + 1
                if self._known_errors.get(p) != msg:
                    # once per file and message, not every scan: half-written files are normal briefly
                    if reason in HOSTILE_REASONS:
                        logger.warning("skipping region %s (%s): %s", p, reason, msg)
                    else:
                        log.v(logger, 3, "skipping region %s: %s", p, msg)
            self._known_errors = dict(res.errors)
        now = self._clock()
        if self.host_source is not None and self._host_sample_due(now):
            # Sampled here, not per scrape: NVML runs in a child process and must not slow /metrics.
            self._host_at = now
            try:
                host, err = self.host_source(), None
            except Exception as exc:
                host, err = None, str(exc)
            if err and err != self._host_error:
                logger.warning("host GPU metrics unavailable: %s", err)
            self._host_error = err
            with self._lock:
                self._host = host
        log.v(
            logger, 5, "scanned %s: %d regions, %d skipped", self.root, len(res.containers), len(res.errors)
        )
        return res

    def _host_sample_due(self, now: float) -> bool:
        """Whether this scan asks NVML for the host GPUs: as often as someone reads them, not every scan.

        A sample is taken one scan interval before the next scrape is expected (the gap between the last
        two scrapes), so a scrape still reads a sample at most about one interval old, as when every scan
        sampled; with nobody scraping, once per ``host_max_age_s``. A change of the MIG apply lock is
        acted on at the next scan, as before (the worker is released or started at once).
        """
        if self._host_at is None or now - self._host_at >= self.host_max_age_s:
            return True
        pause_changed = getattr(self.host_source, "pause_changed", None)
        if callable(pause_changed) and pause_changed():
            return True
        with self._lock:
            scrapes = list(self._scrapes)
        if not scrapes or scrapes[-1] < self._host_at:
            return False  # nobody has read the last sample yet
        gap = scrapes[-1] - scrapes[0] if len(scrapes) == 2 else 0.0
        return now >= scrapes[-1] + gap - 1.5 * self.interval_s

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="shrreg-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        delay = self.interval_s
        while not self._stop.is_set():
            try:
                self.refresh()
                delay = self.interval_s
            except Exception:  # never let the scanner die; back off and retry
                logger.exception("region scan of %s failed", self.root)
                delay = min(max(delay * 2, self.interval_s), 60.0)
            self._stop.wait(delay)

    def snapshot(self) -> tuple[ScanResult, dict[str, PodRef]]:
        with self._lock:
            return self._scan, dict(self._pods)

    # -- Prometheus -----------------------------------------------------------------------------
    def describe(self) -> list:
        return []  # dynamic collector: families depend on the scan

    def collect(self) -> Iterator:
        with self._lock:
            self._scrapes = [*self._scrapes[-1:], self._clock()]
        res, pods = self.snapshot()
        now = int(time.time())

        def fam(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels + ["zone"])

        used = fam("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", CTR_LABELS)
        limit = fam("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", CTR_LABELS)
        # the gpucores share HAMi-core enforces (sm_limit), so a dashboard can set cores used against it
        core_limit = fam("hami_vgpu_core_limit_percent",
                         "vGPU device SM limit (nvidia.com/gpucores) in percent", CTR_LABELS)
        cdev = fam("hami_container_device_memory_bytes", "Container device memory usage in bytes", CTR_LABELS)
        util = fam(
            "hami_container_device_utilization_ratio", "Container device SM utilization ratio", CTR_LABELS
        )
        lastk = fam(
            "hami_container_last_kernel_elapsed_seconds",
            "Seconds since last kernel execution in container",
            CTR_LABELS,
        )
        ctx = fam(
            "hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", CTR_LABELS
        )
        mod = fam("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes", CTR_LABELS)
        buf = fam("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", CTR_LABELS)
        fams = [used, limit, core_limit, cdev, util, lastk, ctx, mod, buf]
        if self.legacy:
            l_used = fam("vGPU_device_memory_usage_in_bytes", "vGPU device usage", LEGACY_CTR_LABELS)
            l_limit = fam("vGPU_device_memory_limit_in_bytes", "vGPU device limit", LEGACY_CTR_LABELS)
            l_desc = fam(
                "Device_memory_desc_of_container",
                "Container device memory description",
                LEGACY_CTR_LABELS + ["context", "module", "data", "offset"],
            )
            l_util = fam(
                "Device_utilization_desc_of_container",
                "Container device utilization description",
                LEGACY_CTR_LABELS,
            )
            l_last = fam(
                "Device_last_kernel_of_container",
                "Container device last kernel description",
                LEGACY_CTR_LABELS,
            )
            fams += [l_used, l_limit, l_desc, l_util, l_last]
        # Agent-specific health of the regions themselves.
        slots = GaugeMetricFamily(
            "hami_shrreg_proc_slots",
            "Process slots in use in the container's shared region",
            labels=["pod_uid", "container", "layout", "version"],
        )
        locked = GaugeMetricFamily(
            "hami_shrreg_lock_held",
            "1 while the region semaphore is held (value 0)",
            labels=["pod_uid", "container", "owner_pid"],
        )
        fams += [slots, locked]

        for c in res.containers:
            r = c.region
            ref = pods.get(c.pod_uid)
            ns, pod = (ref.namespace, ref.name) if ref else ("", c.pod_uid)
            slots.add_metric([c.pod_uid, c.container, r.layout, r.version], len(r.procs))
            locked.add_metric([c.pod_uid, c.container, str(r.owner_pid)], 1.0 if r.locked else 0.0)
            live = [p for p in r.procs if p.status != 0]
            for d in r.device_indices():
                uuid = r.uuids[d][:40]
                labels = [ns, pod, c.container, str(d), uuid, ZONE]
                total = sum(p.used[d].total for p in live)
                context = sum(p.used[d].context_size for p in live)
                module = sum(p.used[d].module_size for p in live)
                data = sum(p.used[d].data_size for p in live)
                sm = sum(p.device_util[d].sm_util for p in live)
                used.add_metric(labels, total)
                limit.add_metric(labels, r.limit[d])
                core_limit.add_metric(labels, r.sm_limit[d])
                cdev.add_metric(labels, total)
                util.add_metric(labels, sm)
                ctx.add_metric(labels, context)
                mod.add_metric(labels, module)
                buf.add_metric(labels, data)
                elapsed = None
                if r.last_kernel_time:
                    elapsed = max(now - r.last_kernel_time, 0)
                    lastk.add_metric(labels, elapsed)
                if self.legacy:
                    l_used.add_metric(labels, total)
                    l_limit.add_metric(labels, r.limit[d])
                    offset = total - context - module - data
                    l_desc.add_metric(
                        labels[:5] + [str(context), str(module), str(data), str(offset), ZONE], total
                    )
                    l_util.add_metric(labels, sm)
                    if elapsed is not None:
                        l_last.add_metric(labels, elapsed)

        if self.host_source is not None:
            yield from self._host_families()

        regions = GaugeMetricFamily("hami_shrreg_regions", "Shared regions read in the last scan", labels=[])
        regions.add_metric([], len(res.containers))
        skipped = GaugeMetricFamily(
            "hami_shrreg_regions_skipped",
            "Region files skipped in the last scan (half-written, damaged, foreign)",
            labels=["reason"],
        )
        counts: dict[str, int] = {}
        for msg in res.errors.values():
            counts[error_reason(msg)] = counts.get(error_reason(msg), 0) + 1
        for reason, n in sorted(counts.items()):
            skipped.add_metric([reason], n)
        with self._lock:
            errors_total = dict(self._errors_total)
            scans_total = self._scans_total
        errs = CounterMetricFamily(
            "hami_shrreg_region_errors", "Region read errors by reason", labels=["reason"]
        )
        for reason, n in sorted(errors_total.items()):
            errs.add_metric([reason], n)
        scans = CounterMetricFamily("hami_shrreg_scans", "Completed scans of the region directory", labels=[])
        scans.add_metric([], scans_total)
        yield from fams
        yield from (regions, skipped, errs, scans)

    def _nvml_families(self) -> Iterator:
        status_fn = getattr(self.host_source, "status", None)
        if not callable(status_fn):
            return
        st = status_fn()
        paused = GaugeMetricFamily("hami_monitor_nvml_paused",
                                   "1 while the MIG apply lock file exists: NVML is not called", labels=[])
        paused.add_metric([], 1.0 if st.paused else 0.0)
        abandoned = GaugeMetricFamily("hami_nvml_abandoned_workers",
                                      "NVML workers killed after a hang that have not exited yet", labels=[])
        abandoned.add_metric([], st.abandoned)
        unkillable = GaugeMetricFamily("hami_nvml_stuck_unkillable",
                                       "1 while no NVML worker may start: the limit of abandoned workers is "
                                       "alive (stuck in the driver)", labels=[])
        unkillable.add_metric([], 1.0 if st.unkillable else 0.0)
        untrusted = GaugeMetricFamily("hami_mig_apply_lock_untrusted",
                                      "1 while a MIG apply lock file exists that is not trusted (not root's, "
                                      "or group/other-writable) and is therefore ignored", labels=[])
        untrusted.add_metric([], 1.0 if getattr(st, "lock_untrusted", "") else 0.0)
        yield from (paused, abandoned, unkillable, untrusted)

    def _host_families(self) -> Iterator:
        yield from self._nvml_families()
        with self._lock:
            samples = self._host
        if samples is None:
            return
        mem = GaugeMetricFamily(
            "hami_host_gpu_memory_used_bytes",
            "GPU device memory usage in bytes",
            labels=HOST_LABELS + ["zone"],
        )
        ut = GaugeMetricFamily(
            "hami_host_gpu_utilization_ratio",
            "GPU core utilization ratio (0-100)",
            labels=HOST_LABELS + ["zone"],
        )
        fams = [mem, ut]
        if self.legacy:
            l_mem = GaugeMetricFamily(
                "HostGPUMemoryUsage", "GPU device memory usage", labels=LEGACY_HOST_LABELS + ["zone"]
            )
            l_ut = GaugeMetricFamily(
                "HostCoreUtilization", "GPU core utilization", labels=LEGACY_HOST_LABELS + ["zone"]
            )
            fams += [l_mem, l_ut]
        node = self.node_name or os.environ.get("NODE_NAME", "")
        for s in samples:
            labels = [node, str(s.index), s.uuid, s.device_type, ZONE]
            if s.memory_used_bytes is not None:
                mem.add_metric(labels, s.memory_used_bytes)
                if self.legacy:
                    l_mem.add_metric(labels, s.memory_used_bytes)
            if s.utilization is not None:
                ut.add_metric(labels, s.utilization)
                if self.legacy:
                    l_ut.add_metric(labels, s.utilization)
        yield from fams
