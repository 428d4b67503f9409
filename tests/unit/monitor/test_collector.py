"""Monitor collector: HAMi's metric names/labels/values, files appearing, vanishing, half-written."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami_agent.monitor.cmd import parse_bind
from hami_agent.monitor.collector import HostGpuSample, PodRef, RegionMonitor
from tests.unit.shrreg.builder import MIB, build, uuid_for

pytestmark = pytest.mark.unit

UID = "6f1c2c1e-0000-4000-8000-00000000abcd"


def samples(registry):
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def make(root, ctr, raw, uid=UID):
    d = root / f"{uid}_{ctr}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "0f3c.cache").write_bytes(raw)
    return d / "0f3c.cache"


def monitor(root, **kw):
    mon = RegionMonitor(str(root), **kw)
    reg = CollectorRegistry()
    reg.register(mon)
    return mon, reg


def test_hami_names_labels_and_values(tmp_path):
    raw = build(
        "v1.2",
        ndev=2,
        limit_mib=4096,
        slots=[(1, 11, 1, [100 * MIB, 7 * MIB]), (2, 12, 1, [50 * MIB]), (3, 13, 0, [999 * MIB])],
    )
    make(tmp_path, "train", raw)
    mon, reg = monitor(tmp_path, pod_resolver=lambda: {UID: PodRef("ml", "trainer-0")})
    mon.refresh()
    s = samples(reg)
    lab = {
        "namespace": "ml",
        "pod": "trainer-0",
        "container": "train",
        "vdevice_index": "0",
        "device_uuid": uuid_for(0),
        "zone": "vGPU",
    }
    assert (lab, 150.0 * MIB) in s["hami_vgpu_memory_used_bytes"]  # exited slot (status 0) skipped
    assert (lab, 4096.0 * MIB) in s["hami_vgpu_memory_limit_bytes"]
    assert (lab, 50.0) in s["hami_vgpu_core_limit_percent"]  # sm_limit (builder default 50)
    assert (lab, 150.0 * MIB) in s["hami_container_device_memory_bytes"]
    assert (lab, 150.0 * MIB) in s["hami_vgpu_memory_buffer_bytes"]  # data_size
    assert (lab, 0.0) in s["hami_vgpu_memory_context_bytes"]
    assert "hami_container_device_utilization_ratio" in s
    assert "hami_container_last_kernel_elapsed_seconds" in s
    legacy = {
        "podnamespace": "ml",
        "podname": "trainer-0",
        "ctrname": "train",
        "vdeviceid": "0",
        "deviceuuid": uuid_for(0),
        "zone": "vGPU",
    }
    assert (legacy, 150.0 * MIB) in s["vGPU_device_memory_usage_in_bytes"]
    assert (legacy, 4096.0 * MIB) in s["vGPU_device_memory_limit_in_bytes"]
    desc = s["Device_memory_desc_of_container"][0][0]
    assert {"context", "module", "data", "offset"} <= set(desc)
    assert "Device_utilization_desc_of_container" in s and "Device_last_kernel_of_container" in s
    dev1 = [v for labels, v in s["hami_vgpu_memory_used_bytes"] if labels["vdevice_index"] == "1"]
    assert dev1 == [7.0 * MIB]


def test_legacy_off_and_pod_uid_fallback(tmp_path):
    make(tmp_path, "c", build("v1.1", slots=[(1, 0, 1, [MIB])]))
    mon, reg = monitor(tmp_path, legacy=False)
    mon.refresh()
    s = samples(reg)
    assert not any(name.startswith(("vGPU_", "Device_")) for name in s)
    labels = s["hami_vgpu_memory_used_bytes"][0][0]
    assert labels["pod"] == UID and labels["namespace"] == ""


def test_v0b_has_no_last_kernel_metric(tmp_path):
    make(tmp_path, "c", build("v0b", slots=[(1, 0, 1, [MIB])]))
    mon, reg = monitor(tmp_path)
    mon.refresh()
    s = samples(reg)
    assert s["hami_vgpu_memory_used_bytes"][0][1] == MIB
    assert "hami_container_last_kernel_elapsed_seconds" not in s


def test_files_appear_vanish_and_half_written(tmp_path):
    mon, reg = monitor(tmp_path)
    mon.refresh()
    assert samples(reg)["hami_shrreg_regions"][0][1] == 0
    a = make(tmp_path, "a", build("v1.2", slots=[(1, 0, 1, [MIB])]))
    make(tmp_path, "half", bytes(2008953))  # created, not yet initialised
    make(tmp_path, "short", build("v1.2")[:4096])  # truncated
    (tmp_path / "no-underscore").mkdir()
    (tmp_path / "no-underscore" / "x.cache").write_bytes(b"")
    mon.refresh()
    s = samples(reg)
    assert s["hami_shrreg_regions"][0][1] == 1
    skipped = {labels["reason"]: v for labels, v in s["hami_shrreg_regions_skipped"]}
    assert skipped == {"not_initialised": 1, "bad_size": 1, "bad_directory_name": 1}
    assert len(s["hami_vgpu_memory_used_bytes"]) == 1
    a.unlink()
    a.parent.rmdir()
    mon.refresh()
    s = samples(reg)
    assert "hami_vgpu_memory_used_bytes" not in s and s["hami_shrreg_regions"][0][1] == 0
    assert s["hami_shrreg_scans_total"][0][1] == 3


def test_pod_resolver_failure_keeps_serving(tmp_path):
    make(tmp_path, "c", build("v1.2", slots=[(1, 0, 1, [MIB])]))

    def boom():
        raise OSError("connection refused")

    mon, reg = monitor(tmp_path, pod_resolver=boom)
    mon.refresh()
    assert samples(reg)["hami_vgpu_memory_used_bytes"][0][0]["pod"] == UID


def test_host_metrics_from_source(tmp_path):
    def src():
        return [
            HostGpuSample(0, "GPU-x", "NVIDIA-H100", 5 * MIB, 42),
            HostGpuSample(1, "GPU-y", "NVIDIA-H100", None, None),
        ]

    mon, reg = monitor(tmp_path, host_source=src, node_name="gpu-1")
    mon.refresh()
    s = samples(reg)
    lab = {
        "node": "gpu-1",
        "device_index": "0",
        "device_uuid": "GPU-x",
        "device_type": "NVIDIA-H100",
        "zone": "vGPU",
    }
    assert s["hami_host_gpu_memory_used_bytes"] == [(lab, 5.0 * MIB)]
    assert s["hami_host_gpu_utilization_ratio"] == [(lab, 42.0)]
    legacy = {
        "nodeid": "gpu-1",
        "deviceidx": "0",
        "deviceuuid": "GPU-x",
        "devicetype": "NVIDIA-H100",
        "zone": "vGPU",
    }
    assert s["HostGPUMemoryUsage"] == [(legacy, 5.0 * MIB)] and s["HostCoreUtilization"] == [(legacy, 42.0)]


class CountingSource:
    """A host source that counts the samples it was asked for (each one NVML round trip in the product)."""

    def __init__(self):
        self.calls = 0
        self.lock_changed = False

    def __call__(self):
        self.calls += 1
        return [HostGpuSample(0, "GPU-x", "NVIDIA-H100", self.calls * MIB, 1)]

    def pause_changed(self):
        return self.lock_changed


def stepped(mon):
    now = [1000.0]
    mon._clock = lambda: now[0]
    return now


def test_host_gpus_are_sampled_as_often_as_they_are_read_not_every_scan(tmp_path):
    src = CountingSource()
    mon, reg = monitor(tmp_path, host_source=src, interval_s=5.0)
    now = stepped(mon)
    taken_at = {}

    def scan(t):
        now[0] = 1000.0 + t
        before = src.calls
        mon.refresh()
        if src.calls > before:
            taken_at[src.calls] = t

    def scrape(t):  # which sample /metrics serves (the fake's memory is its sample number)
        now[0] = 1000.0 + t
        return int(samples(reg)["hami_host_gpu_memory_used_bytes"][0][1] / MIB)

    read = {}
    for t in range(0, 75, 5):  # scans every 5 s; Prometheus every 15 s from t=27
        scan(t)
        if t + 2 in (27, 42, 57, 72):
            read[t + 2] = scrape(t + 2)
    assert src.calls == 4  # 15 scans, 4 scrapes: one sample per scrape (it was one per scan)
    assert read == {27: 1, 42: 2, 57: 3, 72: 4}  # every scrape reads a sample newer than the last one read
    # once the scrape period is known, the sample is taken just before the scrape: at most 1.5 scans old
    assert all(t - taken_at[n] <= 7.5 for t, n in read.items() if t >= 57)


def test_host_gpus_are_sampled_within_a_minute_without_scrapes_and_at_once_on_a_mig_lock_change(tmp_path):
    src = CountingSource()
    mon, _reg = monitor(tmp_path, host_source=src, interval_s=5.0)
    now = stepped(mon)
    mon.refresh()
    now[0] += 59
    mon.refresh()
    assert src.calls == 1
    now[0] += 1
    mon.refresh()
    assert src.calls == 2  # host_max_age_s (60 s) reached
    src.lock_changed = True  # the MIG apply lock appeared: the source must release NVML now
    now[0] += 5
    mon.refresh()
    assert src.calls == 3


def test_nvml_health_of_the_host_source_is_exported(tmp_path):
    """A paused (MIG apply lock) or unkillable NVML shows as gauges, and no stale host samples."""
    from hami_agent.monitor.hostgpu import HostNvmlStatus

    class Source:
        def __init__(self):
            self.state = HostNvmlStatus(paused=True, abandoned=2, unkillable=True)

        def __call__(self):
            return None  # paused: nothing sampled

        def status(self):
            return self.state

    mon, reg = monitor(tmp_path, host_source=Source())
    mon.refresh()
    s = samples(reg)
    assert s["hami_monitor_nvml_paused"] == [({}, 1.0)]
    assert s["hami_nvml_abandoned_workers"] == [({}, 2.0)]
    assert s["hami_nvml_stuck_unkillable"] == [({}, 1.0)]
    assert "hami_host_gpu_memory_used_bytes" not in s


def test_lock_and_slot_gauges(tmp_path):
    make(tmp_path, "c", build("v1.2", owner=77, sem_value=0, slots=[(77, 0, 1, [0])]))
    mon, reg = monitor(tmp_path)
    mon.refresh()
    s = samples(reg)
    assert s["hami_shrreg_lock_held"][0] == ({"pod_uid": UID, "container": "c", "owner_pid": "77"}, 1.0)
    assert s["hami_shrreg_proc_slots"][0][1] == 1


@pytest.mark.parametrize(
    "bind,expected",
    [(":9396", ("0.0.0.0", 9396)), ("127.0.0.1:1", ("127.0.0.1", 1)), ("[::1]:9396", ("::1", 9396))],
)
def test_parse_bind(bind, expected):
    assert parse_bind(bind) == expected


@pytest.mark.parametrize("bad", ["9396", ":0", ":x", "host:99999"])
def test_parse_bind_errors(bad):
    with pytest.raises(ValueError, match="HOST"):
        parse_bind(bad)
