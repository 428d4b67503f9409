# Over 500 lines on purpose: HAMi's whole device-config schema and its validation, one model.
"""One typed configuration model for the agent.

Accepts what HAMi deployments already have, so an existing ConfigMap can be mounted unchanged
(Project-HAMi/HAMi ``pkg/device/nvidia/device.go`` ``NvidiaConfig``; the device plugin's per-node
``config.json``):

* HAMi's ``device-config.yaml``: the ``nvidia:`` section (resource names, request defaults, and the
  node defaults ``deviceSplitCount`` ... that can be overridden per node). Other vendors' sections are
  ignored.
* HAMi's per-node JSON (``{"nodeconfig": [{"name": "<node>", "operatingmode": ...}]}``), either as a
  top-level ``nodeconfig`` list in the same file or as a separate file (``node_config_path``).
* Our own ``agent:`` section (timeouts, intervals, paths, metrics bind).
* Our own ``dra:`` section: the DRA driver's name and which GPUs of which node it manages instead of the
  device plugin (``DraConfig``; docs/dra.md).

YAML or JSON (JSON is YAML). Keys match case-insensitively, as Go's JSON decoding does, so both
``deviceSplitCount`` and ``devicesplitcount`` work. Unknown keys produce warnings (``AgentConfig.warnings``,
also logged); bad values raise :class:`ConfigError` naming the field, the bad value and the fix.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hami_agent.protocol import keys

logger = logging.getLogger(__name__)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

GPU_CORE_POLICIES = ("default", "force", "disable")
MIG_STRATEGIES = ("none", "single", "mixed")
LIB_CUDA_LOG_LEVELS = ("", "0", "1", "2", "3", "4")
# Sections of HAMi's device-config.yaml that belong to other vendors: skipped without a warning.
OTHER_VENDOR_SECTIONS = frozenset({
    "cambricon", "hygon", "metax", "mthreads", "iluvatar", "iluvatars", "enflame", "kunlun", "awsneuron",
    "vastai", "ascend", "vnpus", "amd", "biren", "dcu", "mlu", "xpu", "gcu", "sgpu", "huawei",
})


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field, the bad value and the fix."""


# --------------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MigProfileAllowlistEntry:
    """``migProfileAllowlist`` item: MIG profiles the plugin may publish for matching GPU models."""

    models: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()

    def matches(self, model: str) -> bool:
        """Case-insensitive substring match of any listed model in the NVML name."""
        low = model.lower()
        return any(m.lower() in low for m in self.models)


@dataclass(frozen=True)
class MigGeometryEntry:
    """One ``{name, memory, count}`` of a legacy ``knownMigGeometries`` geometry."""

    name: str
    memory: int = 0
    count: int = 0


@dataclass(frozen=True)
class KnownMigGeometry:
    """Legacy (HAMi <= v2.9) ``knownMigGeometries`` item."""

    models: tuple[str, ...] = ()
    allowed_geometries: tuple[tuple[MigGeometryEntry, ...], ...] = ()


@dataclass(frozen=True)
class NodeDefaults:
    """Keys of the ``nvidia:`` section that the per-node JSON can override (HAMi's NodeDefaultConfig)."""

    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    pre_configured_device_memory: int = 0  # MiB; used when NVML memory info is NOT_SUPPORTED
    lib_cuda_log_level: str = "1"
    enable_numa_topology: bool = False


@dataclass(frozen=True)
class NvidiaConfig(NodeDefaults):
    """The ``nvidia:`` section of HAMi's device-config.yaml. Defaults are the HAMi chart's values.

    Attribute names double as ``hami_agent.protocol.requests.RequestSettings``."""

    resource_count_name: str = keys.RESOURCE_COUNT
    resource_memory_name: str = keys.RESOURCE_MEMORY
    resource_memory_percentage_name: str = keys.RESOURCE_MEMORY_PERCENTAGE
    resource_core_name: str = keys.RESOURCE_CORES
    resource_priority_name: str = keys.RESOURCE_PRIORITY
    overwrite_env: bool = False
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    disable_core_limit: bool = False
    gpu_core_policy: str = "default"
    runtime_class_name: str = ""
    mig_profile_allowlist: tuple[MigProfileAllowlistEntry, ...] = ()
    known_mig_geometries: tuple[KnownMigGeometry, ...] = ()



@dataclass(frozen=True)
class FilterDevices:
    """``filterdevices``: GPUs removed before they are advertised or registered."""

    uuids: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()

    def excludes(self, uuid: str, index: int) -> bool:
        return uuid in self.uuids or index in self.indexes


@dataclass(frozen=True)
class NodeConfig(NodeDefaults):
    """The effective settings for this node: ``nvidia:`` node defaults merged with the matching
    ``nodeconfig`` entry (HAMi's DevicePluginConfigs)."""

    name: str = ""
    operating_mode: str = keys.MODE_HAMI_CORE
    mig_strategy: str = "none"  # parsed but unused by HAMi; kept for the device plugin's own use
    filter_devices: FilterDevices = field(default_factory=FilterDevices)
    enable_get_preferred_allocation: bool = False
    matched: bool = False  # True when a nodeconfig entry named this node


@dataclass(frozen=True)
class AgentSettings:
    """Our own settings (``agent:`` section); not part of HAMi's files."""

    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    rpc_deadline_s: float = 2.0  # hard deadline of every kubelet gRPC answer
    nvml_call_timeout_s: float = 5.0  # an NVML call past this marks the worker stuck
    nvml_refresh_interval_s: float = 30.0  # as HAMi re-reads its devices (register.go, WatchAndRegister)
    api_timeout_s: float = 10.0  # every Kubernetes API call
    register_interval_s: float = 30.0  # node register loop period (HAMi: 30 s)
    register_retry_s: float = 5.0  # after an error (HAMi: 5 s)
    mig_apply_lock_path: str = keys.MIG_APPLY_LOCK_PATH
    hook_path: str = "/usr/local"  # HAMi's HOOK_PATH; HAMi-core files live under <hook_path>/vgpu
    metrics_bind: str = ":9394"  # device plugin (the monitor defaults to :9396, the scheduler to :9395)
    scheduler_metrics_bind: str = ":9395"
    node_lock_expiry_s: float = 300.0  # HAMi NodeLockTimeout (5 min)
    nvml_lib: str = ""  # libnvidia-ml.so.1 path; "" = the system's

    @property
    def vgpu_dir(self) -> str:
        """``<hook_path>/vgpu`` (``/usr/local/vgpu`` by default): libvgpu.so, ld.so.preload, containers/."""
        return self.hook_path.rstrip("/") + "/vgpu"


DEFAULT_DRA_DRIVER = "gpu.hami.io"


@dataclass(frozen=True)
class DraPartition:
    """Which of one node's GPUs the DRA driver (``hami-agent dra``) manages; the device plugin and the
    scheduler extender leave exactly these alone. ``all``: every GPU; else the listed UUIDs and indexes."""

    all: bool = False
    uuids: tuple[str, ...] = ()
    indexes: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.all and not self.uuids and not self.indexes

    def manages(self, uuid: str, index: int | None) -> bool:
        """True for a GPU of this node that belongs to the DRA driver (MIG devices follow their GPU)."""
        return self.all or uuid in self.uuids or (index is not None and index in self.indexes)

    def describe(self) -> str:
        if self.all:
            return "all GPUs"
        if self.empty:
            return "no GPU"
        parts = [f"index {list(self.indexes)}"] if self.indexes else []
        return " and ".join(parts + ([f"uuid {list(self.uuids)}"] if self.uuids else []))


@dataclass(frozen=True)
class DraConfig:
    """The ``dra:`` section: the DRA driver's name and how GPUs are split between the device plugin
    (``nvidia.com/gpu``, HAMi annotations) and the DRA driver (ResourceSlices). Default: no GPU is
    DRA-managed, so existing deployments are unchanged."""

    driver_name: str = DEFAULT_DRA_DRIVER
    devices: DraPartition = field(default_factory=DraPartition)  # nodes without their own entry
    nodes: tuple[tuple[str, DraPartition], ...] = ()

    def partition_for(self, node_name: str | None) -> DraPartition:
        for name, partition in self.nodes:
            if name == node_name:
                return partition
        return self.devices


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent reads from configuration."""

    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    agent: AgentSettings = field(default_factory=AgentSettings)
    dra: DraConfig = field(default_factory=DraConfig)
    node_name: str | None = None
    source: str | None = None  # path(s) read, for logs and doctor
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------------
# value checkers: each returns the converted value or raises ConfigError(field, value, fix)
# --------------------------------------------------------------------------------------------------------

def _fail(where: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"{where}: invalid value {value!r}: {fix}")


def _int(where: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        rng = f" between {lo} and {hi}" if lo is not None and hi is not None else (
            f" >= {lo}" if lo is not None else "")
        raise _fail(where, value, f"use an integer{rng}")
    if lo is not None and value < lo:
        raise _fail(where, value, f"use an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    if hi is not None and value > hi:
        raise _fail(where, value, f"use an integer <= {hi}" + (f" and >= {lo}" if lo is not None else ""))
    return value


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _positive_number(where: str, value: Any) -> float:
    if not _is_number(value) or value <= 0:
        raise _fail(where, value, "use a number > 0 (e.g. 1, or 1.5 to oversubscribe)")
    return float(value)


def _bool(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _fail(where, value, "use true or false")


def _str(where: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(where, value, "use a string")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(where: str, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # libCudaLogLevel: 1 and "1" mean the same
        if not isinstance(value, str) or value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise _fail(where, value, f"use one of {shown}")
        return value
    return check


def _resource_name(where: str, value: Any) -> str:
    if not isinstance(value, str) or "/" not in value or value.startswith("/") or value.endswith("/"):
        raise _fail(where, value, "use a domain-qualified resource name such as 'nvidia.com/gpu'")
    return value


def _str_list(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, value, "use a list of strings")
    return tuple(value)


def _index_list(where: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(where, value, "use a list of GPU indexes, e.g. [0, 1]")
    return tuple(_int(f"{where}[{i}]", v, lo=0) for i, v in enumerate(value))


def _mig_allowlist(where: str, value: Any) -> tuple[MigProfileAllowlistEntry, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(where, value, "use a list of {models: [...], profiles: [...]}")
    out = []
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _fail(w, item, "use {models: [...], profiles: [...]}")
        got = _casefold_keys(item)
        entry = MigProfileAllowlistEntry(models=_str_list(f"{w}.models", got.get("models")),
                                         profiles=_str_list(f"{w}.profiles", got.get("profiles")))
        # HAMi's ValidateMigProfileAllowlist (Project-HAMi/HAMi pkg/device/nvidia/mig_profiles.go): its
        # scheduler and device plugin refuse to start on these; so does the agent, naming the entry
        if not entry.models or not entry.profiles:
            raise _fail(w, item, "MIG profile allowlist must define models and profiles, e.g. "
                        "{models: [A100-SXM4-80GB], profiles: [1g.10gb, 3g.40gb]}")
        for j, prof in enumerate(entry.profiles):
            head, dot, _rest = prof.partition(".")
            if not dot or len(head) < 2 or not head.endswith("g"):
                raise _fail(f"{w}.profiles[{j}]", prof,
                            f'invalid MIG profile "{prof}": use <slices>g.<memory>, e.g. 1g.10gb')
        out.append(entry)
    return tuple(out)


def _known_geometries(where: str, value: Any) -> tuple[KnownMigGeometry, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(where, value,
                    "use a list of {models: [...], allowedGeometries: [[{name, memory, count}]]}")
    out = []
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _fail(w, item, "use {models: [...], allowedGeometries: [...]}")
        got = _casefold_keys(item)
        geoms = []
        raw_geoms = got.get("allowedgeometries") or []
        if not isinstance(raw_geoms, list):
            raise _fail(f"{w}.allowedGeometries", raw_geoms, "use a list of lists of {name, memory, count}")
        for j, geom in enumerate(raw_geoms):
            gw = f"{w}.allowedGeometries[{j}]"
            if not isinstance(geom, list):
                raise _fail(gw, geom, "use a list of {name, memory, count}")
            entries = []
            for k, e in enumerate(geom):
                ew = f"{gw}[{k}]"
                if not isinstance(e, dict):
                    raise _fail(ew, e, "use {name: 1g.10gb, memory: 9728, count: 7}")
                eg = _casefold_keys(e)
                entries.append(MigGeometryEntry(name=_str(f"{ew}.name", eg.get("name")),
                                                memory=_int(f"{ew}.memory", eg.get("memory", 0), lo=0),
                                                count=_int(f"{ew}.count", eg.get("count", 0), lo=0)))
            geoms.append(tuple(entries))
        out.append(KnownMigGeometry(models=_str_list(f"{w}.models", got.get("models")),
                                    allowed_geometries=tuple(geoms)))
    return tuple(out)


def _non_empty_str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, value, "use a non-empty string")
    return value


def _duration(where: str, value: Any) -> float:
    if not _is_number(value) or value <= 0:
        raise _fail(where, value, "use a number of seconds > 0")
    return float(value)


_DRA_DEVICES_FIX = "use 'all', 'none', or {uuid: [GPU-...], index: [0, ...]}"


def _dra_partition(where: str, raw: Any) -> DraPartition:
    if raw is None or (isinstance(raw, str) and raw.lower() == "none"):
        return DraPartition()
    if isinstance(raw, str) and raw.lower() == "all":
        return DraPartition(all=True)
    if not isinstance(raw, dict):
        raise _fail(where, raw, _DRA_DEVICES_FIX)
    got = _casefold_keys(raw)
    unknown = set(got) - {"uuid", "index"}
    if unknown:
        raise _fail(where, raw, f"unknown keys {sorted(unknown)}: {_DRA_DEVICES_FIX}")
    return DraPartition(uuids=_str_list(f"{where}.uuid", got.get("uuid")),
                        indexes=_index_list(f"{where}.index", got.get("index")))


def _dra_config(raw: Any, warnings: list[str]) -> DraConfig:
    """The ``dra:`` section (docs/dra.md#configuration)."""
    if raw is None:
        return DraConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"dra: invalid value {raw!r}: use a mapping with driverName, devices, nodes")
    got = _casefold_keys(raw)
    for key in raw:
        if str(key).lower() not in ("drivername", "devices", "nodes"):
            warnings.append(f"unknown config key dra.{key} ignored")
    driver = got.get("drivername", DEFAULT_DRA_DRIVER)
    if not isinstance(driver, str) or not _DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        raise _fail("dra.driverName", driver, "use a lower-case DNS subdomain of at most 63 characters, "
                    "e.g. gpu.hami.io")
    nodes_raw = got.get("nodes") or []
    if not isinstance(nodes_raw, list):
        raise _fail("dra.nodes", nodes_raw, "use a list of {name: <node>, devices: ...}")
    nodes: list[tuple[str, DraPartition]] = []
    for i, entry in enumerate(nodes_raw):
        where = f"dra.nodes[{i}]"
        if not isinstance(entry, dict):
            raise _fail(where, entry, "use {name: <node>, devices: ...}")
        e = _casefold_keys(entry)
        name = e.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}.name", name, "every dra.nodes entry needs the node's Kubernetes name")
        if any(n == name for n, _ in nodes):
            raise _fail(f"{where}.name", name, "each node may appear once in dra.nodes")
        nodes.append((name, _dra_partition(f"{where}.devices", e.get("devices"))))
    return DraConfig(driver_name=driver, devices=_dra_partition("dra.devices", got.get("devices")),
                     nodes=tuple(nodes))


def without_dra_devices(cfg: AgentConfig) -> AgentConfig:
    """The config as the device plugin must see it: this node's DRA-managed GPUs added to
    ``filterdevices``, so they are neither served to the kubelet nor written to the register annotation.
    Raises ConfigError when every GPU of the node belongs to the DRA driver (nothing left to serve)."""
    part = cfg.dra.partition_for(cfg.node_name)
    if part.empty:
        return cfg
    if part.all:
        raise ConfigError(f"dra.devices: every GPU of node {cfg.node_name or '?'} is assigned to the DRA "
                          "driver, so the device plugin has nothing to serve: do not run it on this node "
                          "(hami_agent_mode: dra), or assign only some GPUs to DRA")
    filt = cfg.node.filter_devices
    merged = FilterDevices(uuids=tuple(dict.fromkeys(filt.uuids + part.uuids)),
                           indexes=tuple(dict.fromkeys(filt.indexes + part.indexes)))
    return replace(cfg, node=replace(cfg.node, filter_devices=merged))


# yaml/json key (lower case) -> (dataclass attribute, checker)
_NODE_DEFAULT_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "devicesplitcount": ("device_split_count", lambda w, v: _int(w, v, lo=1, hi=2**31 - 1)),
    "devicememoryscaling": ("device_memory_scaling", _positive_number),
    "devicecorescaling": ("device_core_scaling", _positive_number),
    "preconfigureddevicememory": ("pre_configured_device_memory",
                                  lambda w, v: _int(w, v, lo=0, hi=2**31 - 1)),
    "libcudaloglevel": ("lib_cuda_log_level", _choice(LIB_CUDA_LOG_LEVELS)),
    "enablenumatopology": ("enable_numa_topology", _bool),
}

_NVIDIA_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    **_NODE_DEFAULT_KEYS,
    "resourcecountname": ("resource_count_name", _resource_name),
    "resourcememoryname": ("resource_memory_name", _resource_name),
    "resourcememorypercentagename": ("resource_memory_percentage_name", _resource_name),
    "resourcecorename": ("resource_core_name", _resource_name),
    "resourcepriorityname": ("resource_priority_name", _resource_name),
    "overwriteenv": ("overwrite_env", _bool),
    "defaultmemory": ("default_memory", lambda w, v: _int(w, v, lo=0, hi=2**31 - 1)),
    "defaultcores": ("default_cores", lambda w, v: _int(w, v, lo=0, hi=100)),
    "defaultgpunum": ("default_gpu_num", lambda w, v: _int(w, v, lo=1, hi=2**31 - 1)),
    "memoryfactor": ("memory_factor", lambda w, v: _int(w, v, lo=1, hi=2**31 - 1)),
    "disablecorelimit": ("disable_core_limit", _bool),
    "gpucorepolicy": ("gpu_core_policy", _choice(GPU_CORE_POLICIES)),
    "runtimeclassname": ("runtime_class_name", _str),
    "migprofileallowlist": ("mig_profile_allowlist", _mig_allowlist),
    "knownmiggeometries": ("known_mig_geometries", _known_geometries),
}
# Keys HAMi's nvidia section has that the agent accepts but does not use (no warning).
_NVIDIA_IGNORED = frozenset({"migtemplate", "vgpucorepolicy"})

_NODECONFIG_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    **_NODE_DEFAULT_KEYS,
    "operatingmode": ("operating_mode", _choice(keys.MODES)),
    "migstrategy": ("mig_strategy", _choice(MIG_STRATEGIES)),
    "enablegetpreferredallocation": ("enable_get_preferred_allocation", _bool),
}

_AGENT_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "deviceplugindir": ("device_plugin_dir", _non_empty_str),
    "rpcdeadlineseconds": ("rpc_deadline_s", _duration),
    "nvmlcalltimeoutseconds": ("nvml_call_timeout_s", _duration),
    "nvmlrefreshintervalseconds": ("nvml_refresh_interval_s", _duration),
    "apitimeoutseconds": ("api_timeout_s", _duration),
    "registerintervalseconds": ("register_interval_s", _duration),
    "registerretryseconds": ("register_retry_s", _duration),
    "migapplylockpath": ("mig_apply_lock_path", _non_empty_str),
    "hookpath": ("hook_path", _non_empty_str),
    "metricsbind": ("metrics_bind", _non_empty_str),
    "schedulermetricsbind": ("scheduler_metrics_bind", _non_empty_str),
    "nodelockexpiryseconds": ("node_lock_expiry_s", _duration),
    "nvmllib": ("nvml_lib", _str),
}


def _casefold_keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in obj.items()}


def _is_zero(value: Any) -> bool:
    return value is None or value is False or value in (0, "", [], {})


def _apply(section: str, raw: Any, table: dict[str, tuple[str, Callable[[str, Any], Any]]],
           warnings: list[str], *, ignored: frozenset[str] = frozenset(), skip_zero: bool = False,
           extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Check the keys of one mapping section; returns {attribute: value}. Unknown keys → warnings.

    ``skip_zero`` mimics HAMi's mergo.WithOverride for node entries: zero values do not override."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: invalid value {raw!r}: use a mapping of keys to values")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        low = str(key).lower()
        if low in table:
            attr, check = table[low]
            if skip_zero and _is_zero(value):
                continue
            out[attr] = check(f"{section}.{key}", value)
        elif low in extra:
            continue
        elif low not in ignored:
            warnings.append(f"unknown config key {section}.{key} ignored")
    return out


def _filter_devices(where: str, raw: Any) -> FilterDevices:
    if raw is None:
        return FilterDevices()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: invalid value {raw!r}: use {{uuid: [GPU-...], index: [0, ...]}}")
    got = _casefold_keys(raw)
    unknown = set(got) - {"uuid", "index"}
    if unknown:
        raise ConfigError(f"{where}: invalid keys {sorted(unknown)!r}: only 'uuid' and 'index' are allowed")
    return FilterDevices(uuids=_str_list(f"{where}.uuid", got.get("uuid")),
                         indexes=_index_list(f"{where}.index", got.get("index")))


# --------------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------------

def _read_document(path: str) -> dict[str, Any]:
    import yaml  # PyYAML; JSON is a subset of YAML 1.2 and parses the same here

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror or exc}): check --config / "
                          "CONFIG_FILE") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML/JSON ({exc}): fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: invalid top-level value {type(data).__name__}: use a mapping "
                          "with 'nvidia:', 'nodeconfig:' and/or 'agent:'")
    return data


def _node_entries(where: str, raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ConfigError(f"{where}: invalid value {raw!r}: use a list of {{name: <node>, ...}} objects")
    return raw


def build_config(documents: list[dict[str, Any]], node_name: str | None,
                 source: str | None = None) -> AgentConfig:
    """Build an AgentConfig from parsed documents (later documents override earlier ones)."""
    warnings: list[str] = []
    nvidia_vals: dict[str, Any] = {}
    agent_vals: dict[str, Any] = {}
    dra = DraConfig()
    entries: list[tuple[str, dict[str, Any]]] = []
    for doc in documents:
        for key, value in doc.items():
            low = str(key).lower()
            if low == "nvidia":
                nvidia_vals.update(_apply("nvidia", value, _NVIDIA_KEYS, warnings, ignored=_NVIDIA_IGNORED))
            elif low == "agent":
                agent_vals.update(_apply("agent", value, _AGENT_KEYS, warnings))
            elif low == "dra":
                dra = _dra_config(value, warnings)
            elif low == "nodeconfig":
                entries += [("nodeconfig", e) for e in _node_entries("nodeconfig", value)]
            elif low in OTHER_VENDOR_SECTIONS:
                continue
            else:
                warnings.append(f"unknown config key {key} ignored")
    nvidia = replace(NvidiaConfig(), **nvidia_vals)
    agent = replace(AgentSettings(), **agent_vals)

    base = {f.name: getattr(nvidia, f.name) for f in fields(NodeDefaults)}
    node_vals: dict[str, Any] = {}
    filt = FilterDevices()
    matched = False
    for i, (section, entry) in enumerate(entries):
        got = _casefold_keys(entry)
        where = f"{section}[{i}]"
        name = got.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: invalid value {name!r}: every nodeconfig entry needs the "
                              "node's Kubernetes name")
        # validate every entry (not only ours): a typo must fail on every node, not just the one it names
        vals = _apply(f"{where}", entry, _NODECONFIG_KEYS, warnings, skip_zero=True,
                      extra=frozenset({"name", "filterdevices"}))
        entry_filter = _filter_devices(f"{where}.filterdevices", got.get("filterdevices"))
        if name == node_name:
            if matched:
                warnings.append(f"{where}: a second nodeconfig entry for node {name!r} is ignored")
                continue
            matched = True
            node_vals = vals
            filt = entry_filter
    node = NodeConfig(**base, name=node_name or "", filter_devices=filt, matched=matched)
    node = replace(node, **node_vals)
    if node.operating_mode == keys.MODE_MIG and node.device_memory_scaling != 1.0:
        warnings.append("deviceMemoryScaling is ignored in mig mode (MIG memory is not oversubscribed)")
    if node.operating_mode == keys.MODE_MIG and not nvidia.mig_profile_allowlist:
        warnings.append("operatingmode mig without nvidia.migProfileAllowlist: no GPU can be served (HAMi "
                        "v2.10 publishes only allowlisted MIG profiles); add "
                        "{models: [...], profiles: [...]}")
    if nvidia.known_mig_geometries and not nvidia.mig_profile_allowlist:
        union = sorted({e.name for g in nvidia.known_mig_geometries for geo in g.allowed_geometries
                        for e in geo})
        warnings.append("nvidia.knownMigGeometries is HAMi's legacy (<= v2.9) MIG layout list and is not "
                        "used for dynamic MIG; HAMi v2.10 reads nvidia.migProfileAllowlist (its migration "
                        f"guide: take the union of the geometries' profile names, here {union})")
    for w in warnings:
        logger.warning("%s", w)
    return AgentConfig(nvidia=nvidia, node=node, agent=agent, dra=dra, node_name=node_name, source=source,
                       warnings=tuple(warnings))


def load_config(path: str | None, node_name: str | None, node_config_path: str | None = None) -> AgentConfig:
    """Load the agent config. ``path``: HAMi device-config.yaml / our YAML / JSON (None → defaults).
    ``node_config_path``: optional separate HAMi per-node JSON (``/config/config.json``).
    ``node_name``: selects the ``nodeconfig`` entry (env NODE_NAME in HAMi)."""
    docs: list[dict[str, Any]] = []
    sources = []
    for p in (path, node_config_path):
        if p:
            docs.append(_read_document(p))
            sources.append(p)
    return build_config(docs, node_name, source=", ".join(sources) or None)
