"""NVML errors, worded like HAMi's device plugin logs them (the seeds grep for these words)."""

from __future__ import annotations

# NVML function -> the phrase HAMi logs when it fails (seed 000: `nvml Init err`,
# `nvml GetDeviceCount err`, `nvml get memory error`).
_PHRASES = {
    "nvmlInit": "nvml Init err",
    "nvmlDeviceGetCount": "nvml GetDeviceCount err",
    "nvmlDeviceGetMemoryInfo": "nvml get memory error",
}


def phrase_for(call: str) -> str:
    if call in _PHRASES:
        return _PHRASES[call]
    short = call[4:] if call.startswith("nvml") else call
    for prefix in ("Device", "System"):
        if short.startswith(prefix) and len(short) > len(prefix):
            short = short[len(prefix):]
    return f"nvml {short} err"


class NvmlError(RuntimeError):
    """An NVML call failed (or NVML could not be loaded). ``call`` names the NVML function."""

    def __init__(self, message: str, call: str | None = None, code: int | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.code = code


class NvmlTimeout(NvmlError):
    """An NVML call did not return within its deadline: the driver is hung in that call."""

    def __init__(self, call: str, timeout_s: float, pid: int | None = None) -> None:
        msg = f"nvml call {call} did not return within {timeout_s:g}s (NVML is hung"
        msg += f"; worker pid {pid} abandoned)" if pid else ")"
        super().__init__(msg, call=call)
        self.timeout_s = timeout_s
        self.pid = pid


class NvmlStuckUnkillable(NvmlError):
    """No NVML worker may start: ``limit`` abandoned workers were killed and are still alive.

    A worker stuck in the driver (D state) does not die on SIGKILL; every new worker that hangs the same way
    would stay too. ``processes`` describes them (pid, the call it hung in, /proc state and wchan)."""

    REASON = "nvml-stuck-unkillable"

    def __init__(self, processes: list[str], limit: int) -> None:
        self.processes = list(processes)
        self.limit = limit
        super().__init__(
            f"{self.REASON}: {len(self.processes)} NVML worker process(es) were killed and have not exited "
            f"({'; '.join(self.processes)}): the driver does not return; no new NVML worker is started until "
            f"one of them exits (limit {limit} abandoned workers)")
