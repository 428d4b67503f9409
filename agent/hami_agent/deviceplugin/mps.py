"""MPS mode startup check: the control binary must exist and answer (seed 003 §5.2: after a driver
upgrade ``nvidia-cuda-mps-control`` was gone and MPS failed with "executable file not found")."""

from __future__ import annotations

import shutil
import subprocess

MISSING_HINT = ("install the driver's compute utilities (Ubuntu: nvidia-compute-utils-<branch>, e.g. "
                "nvidia-compute-utils-570) on the host")


class MpsError(RuntimeError):
    pass


def check_mps_control(binary: str = "nvidia-cuda-mps-control", timeout_s: float = 5.0) -> str:
    """Return the resolved path of ``binary``; raise ``MpsError`` naming it when it is missing/broken."""
    path = shutil.which(binary)
    if path is None:
        raise MpsError(f'MPS mode needs {binary}: exec: "{binary}": executable file not found in $PATH; '
                       + MISSING_HINT)
    try:
        proc = subprocess.run([path], input="get_server_list\n", capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MpsError(f"MPS mode: {path} did not answer 'get_server_list' within {timeout_s:g}s") from None
    except OSError as exc:
        raise MpsError(f"MPS mode needs {binary}: cannot run {path}: {exc}; {MISSING_HINT}") from None
    if proc.returncode == 127:
        raise MpsError(f"MPS mode needs {binary}: {path}: command not found (exit 127); {MISSING_HINT}")
    return path
