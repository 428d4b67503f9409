# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Run ``nvidia-smi`` with a hard deadline and parse its output. PRIVATE to the hami.node collection.

Why not ``AnsibleModule.run_command``: it has no timeout, and ``nvidia-smi`` blocks forever when NVML
hangs (NVIDIA gpu-operator #1361; seed 003). ``run_bounded`` starts the tool in its own session, kills the
whole group at the deadline and never waits on a child stuck in the driver (D state): the module reports
``nvml_hang_suspected`` instead of hanging the play.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

from ansible_collections.hami.node.plugins.module_utils import known_bad_drivers

DRIVER_NOT_LOADED_MARK = "couldn't communicate with the NVIDIA driver"
C_LOCALE = {"LC_ALL": "C", "LANG": "C", "LANGUAGE": "C"}

QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "driver_version",
    "pci.bus_id",
    "mig.mode.current",
    "mig.mode.pending",
    "compute_mode",
    "persistence_mode",
    "serial",
)


def _fixed_in():
    return " or ".join(sorted({e["fixed_in"] for e in known_bad_drivers.KNOWN_BAD_DRIVERS.values()}))


class SmiTimeout(Exception):
    """The tool did not finish before its deadline: NVML is probably hung."""

    def __init__(self, argv, timeout_s):
        self.argv = list(argv)
        self.timeout_s = timeout_s
        super().__init__(
            "%s did not answer within %ss: NVML hang suspected (known trigger: driver %s with mixed MIG "
            "+ full GPUs, NVIDIA gpu-operator #1361). Check `dmesg -T` for Xid errors and processes in D "
            "state; upgrade the driver to %s or disable MIG on the node, then reboot."
            % (" ".join(self.argv[:3]), timeout_s, known_bad_drivers.describe_versions("or"), _fixed_in())
        )


class SmiResult:
    def __init__(self, argv, rc, out, err):
        self.argv = list(argv)
        self.rc = rc
        self.out = out
        self.err = err

    @property
    def driver_not_loaded(self):
        return self.rc == 9 or DRIVER_NOT_LOADED_MARK in (self.out + self.err)

    def as_dict(self):
        return {"cmd": self.argv, "rc": self.rc, "stdout": self.out, "stderr": self.err}


def run_bounded(argv, timeout_s, env=None, data=None):
    """Run argv with C locale; return SmiResult or raise SmiTimeout. Never blocks past ~timeout_s + 2 s."""
    full_env = dict(os.environ if env is None else env)
    full_env.update(C_LOCALE)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input=data.encode() if data is not None else None, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            # A process stuck in the driver may ignore SIGKILL: wait briefly, then abandon it.
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        raise SmiTimeout(argv, timeout_s) from None
    return SmiResult(argv, proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


# ------------------------------------------------------------------------------------------ parsing
def _na(value):
    value = value.strip()
    if value in ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""):
        return None
    return value


def _int(value):
    value = _na(value)
    if value is None:
        return None
    m = re.match(r"^(-?\d+)", value)
    return int(m.group(1)) if m else None


def _mode(value):
    value = _na(value)
    if value is None:
        return None
    return value.lower() in ("enabled", "on", "1")


def parse_csv(text, fields):
    """Parse ``--query-gpu=<fields> --format=csv[,noheader][,nounits]`` into a list of dicts.

    A header line (``index, name, memory.total [MiB]``) is detected and skipped. Values keep nvidia-smi's
    strings except the typed fields below; ``[N/A]`` becomes None.
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) != len(fields):
            # Names may contain ", " in theory; fall back to splitting on commas only at field count.
            parts = [p.strip() for p in line.split(",", len(fields) - 1)]
        if len(parts) != len(fields):
            raise ValueError(
                "nvidia-smi CSV line has %d values, expected %d: %r" % (len(parts), len(fields), line)
            )
        if parts[0] == fields[0] or parts[0].startswith(fields[0] + " ["):
            continue  # header
        rows.append(dict(zip(fields, parts)))  # noqa: B905 - lengths checked above; py<3.10 targets
    return rows


def gpus_from_query(rows):
    """Typed GPU records from parse_csv(..., QUERY_FIELDS) rows."""
    gpus = []
    for row in rows:
        gpus.append(
            {
                "index": _int(row.get("index", "")),
                "uuid": row.get("uuid"),
                "name": row.get("name"),
                "memory_total_mib": _int(row.get("memory.total", "")),
                "memory_used_mib": _int(row.get("memory.used", "")),
                "pci_bus_id": row.get("pci.bus_id"),
                "mig_capable": _na(row.get("mig.mode.current", "")) is not None,
                "mig_enabled": bool(_mode(row.get("mig.mode.current", ""))),
                "mig_pending": bool(_mode(row.get("mig.mode.pending", ""))),
                "compute_mode": _na(row.get("compute_mode", "")),
                "persistence_mode": bool(_mode(row.get("persistence_mode", ""))),
                "serial": _na(row.get("serial", "")),
            }
        )
    return gpus


_L_GPU = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s+(GPU-[0-9a-fA-F-]+)\)\s*$")
_L_MIG = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[0-9a-fA-F-]+)\)\s*$")


def parse_list(text):
    """Parse ``nvidia-smi -L`` (whitespace-tolerant: copy-pasted outputs such as seed 003's work too)."""
    gpus = []
    for line in text.splitlines():
        m = _L_GPU.match(line.strip())
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig_devices": []})
            continue
        m = _L_MIG.match(line)
        if m and gpus:
            gpus[-1]["mig_devices"].append(
                {"profile": m.group(1), "index": int(m.group(2)), "uuid": m.group(3)}
            )
    return gpus


_LGI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
_LCI = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
_LGIP = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\S+)\s+(\d+)")


def parse_lgi(text):
    """``nvidia-smi mig -lgi`` -> [{gpu, profile, profile_id, gi_id, start, size}] ('Not Found' -> [])."""
    out = []
    for line in text.splitlines():
        m = _LGI.match(line.strip())
        if m:
            out.append(
                {
                    "gpu": int(m.group(1)),
                    "profile": m.group(2),
                    "profile_id": int(m.group(3)),
                    "gi_id": int(m.group(4)),
                    "start": int(m.group(5)),
                    "size": int(m.group(6)),
                }
            )
    return out


def parse_lci(text):
    """``nvidia-smi mig -lci`` -> [{gpu, gi_id, profile, profile_id, ci_id}]."""
    out = []
    for line in text.splitlines():
        m = _LCI.match(line.strip())
        if m:
            out.append(
                {
                    "gpu": int(m.group(1)),
                    "gi_id": int(m.group(2)),
                    "profile": m.group(3),
                    "profile_id": int(m.group(4)),
                    "ci_id": int(m.group(5)),
                }
            )
    return out


def parse_lgip(text):
    """``nvidia-smi mig -lgip`` -> [{gpu, name, profile_id, free, total, memory_gib}]."""
    out = []
    for line in text.splitlines():
        m = _LGIP.match(line.strip())
        if m:
            out.append(
                {
                    "gpu": int(m.group(1)),
                    "name": m.group(2),
                    "profile_id": int(m.group(3)),
                    "free": int(m.group(4)),
                    "total": int(m.group(5)),
                    "memory_gib": float(m.group(6)),
                }
            )
    return out


def parse_q_versions(text):
    """Driver and CUDA version from ``nvidia-smi -q`` (or the summary header)."""
    out = {"driver_version": None, "cuda_version": None}
    m = re.search(r"Driver Version\s*:?\s*([0-9][0-9.]+)", text)
    if m:
        out["driver_version"] = m.group(1)
    m = re.search(r"CUDA Version\s*:?\s*([0-9]+\.[0-9]+)", text)
    if m:
        out["cuda_version"] = m.group(1)
    return out


def no_instances(result):
    """True when a -lgi/-lci call failed only because nothing exists (rc 6, 'Not Found')."""
    return result.rc != 0 and ("Not Found" in result.out or "No MIG-enabled devices" in result.out)
