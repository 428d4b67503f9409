# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""MPS control daemon helpers. PRIVATE to the hami.node collection."""

from __future__ import annotations

import os
import re

PID_FILE = "nvidia-cuda-mps-control.pid"


def missing_binary_message(branch):
    """The diagnosis of seed 003 §5.2 (mps-control-daemon CrashLoopBackOff after a driver upgrade)."""
    pkg = "nvidia-compute-utils-%s" % (branch or "<branch>")
    return (
        "nvidia-cuda-mps-control: executable file not found in $PATH. Without it the MPS control daemon "
        "cannot start (the device plugin's mps-control-daemon goes CrashLoopBackOff with "
        '"Failed to start MPS daemon"). '
        "It ships in %s (or %s-server), which a driver upgrade can remove: install the one matching the "
        "loaded driver branch, e.g. `apt-get install %s`." % (pkg, pkg, pkg)
    )


def daemon_pid(pipe_dir):
    """PID of a live control daemon from its pid file in the pipe directory, else None."""
    try:
        with open(os.path.join(pipe_dir, PID_FILE), encoding="utf-8") as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # exists, owned by someone else
    return pid


def parse_percentage(text):
    m = re.search(r"(-?\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_bytes(value):
    """'2G' / '2048M' / '2147483648' -> bytes (None when not a size), so equal limits compare equal."""
    m = _SIZE.match(str(value or ""))
    if not m:
        return None
    return int(float(m.group(1)) * _MULT[m.group(2).upper()])


def same_limit(current, wanted):
    a, b = size_bytes(current), size_bytes(wanted)
    if a is None or b is None:
        return str(current).strip() == str(wanted).strip()
    return a == b
