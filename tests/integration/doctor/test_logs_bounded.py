"""Issue 14 finding 5, doctor side: logs read as bounded streams, rotated .gz logs, unreadable input said.

A 205 MB kubelet log took 1.63 GB of RSS; a gzipped stall log answered "no problem found"; so did a
truncated gzip and binary garbage."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.doctor.helpers import codes, run_doctor, verdict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STALL = LOGS / "seed003_kubelet_stalled_then_later.log"
NORMAL = LOGS / "seed003_kubelet_normal.log"
STALL_UID = "69e0758e-d625-4013-9258-df8b7ddf04e2"

# Run doctor in a fresh interpreter and report its peak RSS (RUSAGE_CHILDREN of a process whose only
# child is doctor: nothing else of the test run can inflate the number).
RSS_PROBE = """
import resource, subprocess, sys
cp = subprocess.run([sys.executable, "-m", "hami_agent", "doctor", "logs", "--kubelet", sys.argv[1],
                     "--collector-timeout", "600"], capture_output=True, text=True)
print(cp.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, flush=True)
sys.stderr.write(cp.stdout[-2000:] + cp.stderr[-2000:])
"""


def test_a_large_kubelet_log_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """96 MB of kubelet log (long klog lines, one admitted pod per MB): the old reader held every line
    (~150 MB RSS here for this file, 482 MB for 200 MB); the stream stays near the interpreter's own."""
    log = tmp_path / "kubelet.log"
    noise = "I0730 19:37:04.000001   26361 reflector.go:88] " + "watch event " * 340 + "\n"
    block = (noise * 256 + NORMAL.read_text()).encode()
    with open(log, "wb") as out:
        for _ in range((96 << 20) // len(block)):
            out.write(block)
    try:
        cp = subprocess.run([sys.executable, "-c", RSS_PROBE, str(log)], capture_output=True, text=True,
                            timeout=280, check=False)
        rc, rss_mib = map(int, cp.stdout.split())
        assert rc == 0, cp.stderr  # no problem in this log, and it was read to the end
        assert rss_mib < 80, f"doctor peaked at {rss_mib} MiB RSS for a 96 MiB log"
    finally:
        log.unlink()


def test_rotated_gzip_stall_log_is_found(tmp_path: Path, capsys) -> None:
    gz = tmp_path / "kubelet.log.1.gz"
    gz.write_bytes(gzip.compress(STALL.read_bytes()))
    rc, report = run_doctor(capsys, "logs", "--kubelet", str(gz))
    assert rc == 1 and "KUBELET_DEVICE_MANAGER_STALL" in codes(report)
    assert report["facts"]["kubelet.stall.pod_uid"] == STALL_UID


def test_truncated_gzip_is_unknown_with_the_reason(tmp_path: Path, capsys) -> None:
    gz = tmp_path / "kubelet.log.gz"
    # a normal log (no stall in it) whose gzip was cut: health must not be claimed from half a file
    whole = gzip.compress(NORMAL.read_bytes() * 40)
    gz.write_bytes(whole[: len(whole) // 2])
    rc, report = run_doctor(capsys, "logs", "--kubelet", str(gz))
    assert rc == 1 and codes(report) == ["UNKNOWN"]
    assert "truncated or damaged gzip" in verdict(report, "UNKNOWN")["summary"]


def test_binary_garbage_is_unknown_with_the_reason(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "kubelet.log"
    junk.write_bytes(os.urandom(200_000))
    rc, report = run_doctor(capsys, "logs", "--kubelet", str(junk), "--plugin", str(junk))
    assert rc == 1 and codes(report) == ["UNKNOWN"]
    assert "not a text log" in verdict(report, "UNKNOWN")["summary"]


def test_a_text_file_that_is_not_a_kubelet_log_is_unknown(tmp_path: Path, capsys) -> None:
    wrong = tmp_path / "kubelet.log"
    wrong.write_text("this is a README, not a log\n" * 50)
    rc, report = run_doctor(capsys, "logs", "--kubelet", str(wrong))
    assert rc == 1 and "not a kubelet log" in verdict(report, "UNKNOWN")["summary"]


def test_permission_denied_is_unknown_with_the_reason(tmp_path: Path) -> None:
    """The log exists but cannot be read. Root reads everything, so as root doctor runs with every
    capability dropped (setpriv): uid 0 without CAP_DAC_OVERRIDE meets the file's mode 000."""
    log = tmp_path / "kubelet.log"
    shutil.copy(STALL, log)
    log.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv (util-linux): cannot make a file unreadable")
        prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-all"]
    cp = subprocess.run([*prefix, sys.executable, "-m", "hami_agent", "doctor", "logs", "--kubelet", str(log),
                         "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert cp.returncode == 1, cp.stderr
    report = json.loads(cp.stdout)
    assert codes(report) == ["UNKNOWN"]
    assert "Permission denied" in verdict(report, "UNKNOWN")["summary"]
