"""roles/hami_core/files/elf_dynsyms.py: the check that keeps a non-HAMi-core library out of ld.so.preload.

Shared objects are compiled with gcc here (skipped without gcc); the script runs as the role runs it, as a
separate ``python3`` process printing JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build test libraries")]

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "hami_core" / "files" / "elf_dynsyms.py"


def _build(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["gcc", *flags, "-o", str(out), str(src)], check=True, capture_output=True, timeout=60)
    return out


def _symbols(path: Path) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.timeout(120)
def test_lists_defined_exports_and_not_imports(tmp_path: Path) -> None:
    lib = _build(tmp_path, "libvgpu.so", """
        #include <stdio.h>
        int cuInit(unsigned int f) { printf("%u", f); return 0; }
        int cuMemAlloc_v2(void **p, unsigned long n) { (void)p; (void)n; return 0; }
        static int hidden_helper(void) { return 1; }
        int use_helper(void) { return hidden_helper(); }
    """, "-shared", "-fPIC")
    out = _symbols(lib)
    assert out["elf"] is True and out["error"] is None
    assert {"cuInit", "cuMemAlloc_v2", "use_helper"} <= set(out["defined"])
    assert "printf" not in out["defined"]          # imported (undefined), not exported
    assert "hidden_helper" not in out["defined"]   # static: not in the dynamic table


@pytest.mark.timeout(120)
def test_library_without_hooks_lacks_them(tmp_path: Path) -> None:
    lib = _build(tmp_path, "other.so", "int some_other_function(void) { return 42; }\n", "-shared", "-fPIC")
    out = _symbols(lib)
    assert out["elf"] is True
    assert "cuInit" not in out["defined"] and "some_other_function" in out["defined"]


@pytest.mark.timeout(120)
def test_static_executable_is_not_a_shared_object(tmp_path: Path) -> None:
    exe = _build(tmp_path, "prog", "int main(void) { return 0; }\n", "-no-pie")
    out = _symbols(exe)
    assert out["elf"] is False
    assert "not a shared object" in out["error"]


def test_non_elf_and_missing_files_are_reported(tmp_path: Path) -> None:
    text = tmp_path / "libvgpu.so"
    text.write_text("this is a text file\n")
    assert "not an ELF file" in _symbols(text)["error"]
    missing = _symbols(tmp_path / "absent.so")
    assert missing["elf"] is False and "No such file" in missing["error"]


def test_truncated_elf_is_reported_not_crashing(tmp_path: Path) -> None:
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00")
    out = _symbols(broken)
    assert out["elf"] is False and out["error"]
