"""Reusable pytest fixtures for the simulated GPU node (gpusim).

Use in a conftest.py::

    from tests.gpusim.fixtures import gpusim_lib, gpusim_node, gpusim_factory  # noqa: F401

``gpusim_lib``      (session) builds ``tests/gpusim/build/libnvidia-ml.so.1`` once and returns its path.
``gpusim_node``     a ``GpusimNode`` for seed 003's node (``h20-mig-mixed``) on the FIXED driver
                    570.172.08, so NVML works; ``GPUSIM_STATE`` and ``HAMI_NVML_LIBRARY`` are set.
``gpusim_factory``  ``make(profile, driver=None, name=None) -> GpusimNode`` for anything else; the
                    last node made is the one the environment variables point at.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gpusim import gpusim_state as gs

GPUSIM_DIR = Path(__file__).resolve().parent
BUILD_DIR = GPUSIM_DIR / "build"
LIB_PATH = BUILD_DIR / "libnvidia-ml.so.1"
BIN_DIR = GPUSIM_DIR / "bin"
GPUSIM_CLI = BIN_DIR / "gpusim"


def build_lib(timeout_s: float = 120.0) -> Path:
    """Run ``make -C tests/gpusim`` (quick when up to date), serialised across processes."""
    BUILD_DIR.mkdir(exist_ok=True)
    with open(BUILD_DIR / ".build.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            proc = subprocess.run(
                ["make", "--no-print-directory", "-C", str(GPUSIM_DIR)],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    if proc.returncode != 0 or not LIB_PATH.exists():
        raise RuntimeError(f"building gpusim failed (make -C {GPUSIM_DIR}):\n{proc.stdout}{proc.stderr}")
    return LIB_PATH


@dataclass
class GpusimNode:
    """One simulated node: a state file plus the library that reads it."""

    state_path: Path
    lib_path: Path

    def state(self) -> dict[str, Any]:
        return gs.read_state(self.state_path)

    def update(self, fn: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        def edit(state: dict[str, Any]) -> None:
            fn(state)

        return gs.update_state(self.state_path, edit)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child process that should see this node (NVML and the stubs)."""
        env = dict(os.environ if base is None else base)
        env["GPUSIM_STATE"] = str(self.state_path)
        env["HAMI_NVML_LIBRARY"] = str(self.lib_path)
        env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
        return env

    # convenience edits (each an atomic rewrite of the state file)
    def set_driver(self, version: str) -> None:
        self.update(lambda s: gs.set_driver_version(s, version))

    def set_fault(self, **faults: Any) -> None:
        """e.g. ``set_fault(init_hang=True)``, ``set_fault(hang_after_calls=5)``."""
        self.update(lambda s: s.setdefault("faults", {}).update(faults))

    def clear_faults(self) -> None:
        self.set_fault(init_hang=False, hang_after_calls=None, hang_functions=[], unsupported_functions=[],
                       hang_file=None)

    def add_xid(self, gpu: int, xid: int, gi_id: int | None = None) -> int:
        seq: list[int] = []
        self.update(lambda s: seq.append(gs.add_xid(s, gpu, xid, gi_id=gi_id)))
        return seq[0]

    def set_lost(self, gpu: int, lost: bool = True) -> None:
        self.update(lambda s: s["gpus"][gpu].__setitem__("lost", lost))


def make_node(directory: Path, profile: str, driver: str | None = None, name: str | None = None,
              lib_path: Path = LIB_PATH) -> GpusimNode:
    state = gs.load_profile(profile)
    if driver:
        gs.set_driver_version(state, driver)
    path = directory / f"{name or profile}.state.json"
    gs.write_state(path, state)
    return GpusimNode(state_path=path, lib_path=lib_path)


@pytest.fixture(scope="session")
def gpusim_lib() -> Path:
    return build_lib()


@pytest.fixture
def gpusim_factory(gpusim_lib: Path, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., GpusimNode]]:
    def make(profile: str = "h20-mig-mixed", driver: str | None = None,
             name: str | None = None) -> GpusimNode:
        node = make_node(tmp_path, profile, driver=driver, name=name, lib_path=gpusim_lib)
        monkeypatch.setenv("GPUSIM_STATE", str(node.state_path))
        monkeypatch.setenv("HAMI_NVML_LIBRARY", str(gpusim_lib))
        return node

    yield make


@pytest.fixture
def gpusim_node(gpusim_factory: Callable[..., GpusimNode]) -> GpusimNode:
    return gpusim_factory("h20-mig-mixed", driver=gs.FIXED_DRIVER)
