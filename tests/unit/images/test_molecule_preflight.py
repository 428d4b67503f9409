"""extensions/molecule/shared/preflight.sh: molecule's dependency step fails early, naming the command
that builds what is missing, and links the checkout as ``hami.node`` (a fake ``podman`` on PATH answers
``podman image exists``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "extensions" / "molecule" / "shared" / "preflight.sh"
IMAGE = "localhost/hami-node-test:bookworm"


def _project(tmp_path: Path, apt: bool = True, gpusim: bool = True) -> Path:
    project = tmp_path / "project"
    (project / "tests" / "images" / "build" / "apt-repo").mkdir(parents=True)
    (project / "tests" / "gpusim" / "build").mkdir(parents=True)
    if apt:
        (project / "tests" / "images" / "build" / "apt-repo" / "Packages").write_text("")
    if gpusim:
        (project / "tests" / "gpusim" / "build" / "libnvidia-ml.so.1").write_text("")
    return project


def _run(tmp_path: Path, project: Path, images: list[str]) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    podman = fake / "podman"
    known = " ".join(f'"{i}"' for i in images)
    podman.write_text(
        "#!/bin/bash\n"
        '[[ $1 == image && $2 == exists ]] || exit 2\n'
        f'for i in {known}; do [[ $i == "$3" ]] && exit 0; done\n'
        "exit 1\n"
    )
    podman.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", str(SCRIPT), str(project), str(tmp_path / "eph"), IMAGE], env=env,
                          text=True, capture_output=True, timeout=30, check=False)


def test_everything_present_links_the_checkout_as_hami_node(tmp_path: Path) -> None:
    project = _project(tmp_path)
    proc = _run(tmp_path, project, [IMAGE])
    assert proc.returncode == 0, proc.stderr
    link = tmp_path / "eph" / "collections" / "ansible_collections" / "hami" / "node"
    assert link.is_symlink() and link.resolve() == project.resolve()
    # a second run (molecule converge after test) replaces the link instead of nesting one inside it
    assert _run(tmp_path, project, [IMAGE]).returncode == 0
    assert not any(p.is_symlink() for p in project.iterdir()) and link.resolve() == project.resolve()


@pytest.mark.parametrize(("images", "apt", "gpusim", "expected"), [
    ([], True, True, f"the node image {IMAGE} is missing: build it with tests/images/build-image.sh"),
    ([IMAGE], False, True, "apt repository is missing: build it with tests/images/build-apt-repo.sh"),
    ([IMAGE], True, False, "libnvidia-ml.so.1 is missing: run make setup"),
])
def test_a_missing_piece_fails_early_naming_the_command(
        tmp_path: Path, images: list[str], apt: bool, gpusim: bool, expected: str) -> None:
    proc = _run(tmp_path, _project(tmp_path, apt=apt, gpusim=gpusim), images)
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "eph").exists()  # nothing linked
