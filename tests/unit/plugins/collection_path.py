"""Make this repository importable as the ``hami.node`` collection (tests only).

Ansible imports collection code as ``ansible_collections.<ns>.<name>``; the repo root is the collection
root, so a temporary ``ansible_collections/hami/node`` symlink to it is put on ``sys.path`` (and is what
ANSIBLE_COLLECTIONS_PATH points at in the integration tests).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_ROOT: Path | None = None


def collections_root() -> Path:
    global _ROOT  # one symlink tree per test process
    if _ROOT is None:
        root = Path(tempfile.mkdtemp(prefix="hami-node-collections-"))
        (root / "ansible_collections" / "hami").mkdir(parents=True)
        os.symlink(REPO, root / "ansible_collections" / "hami" / "node")
        atexit.register(shutil.rmtree, root, True)
        _ROOT = root
    return _ROOT


def install() -> Path:
    root = collections_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # ansible_collections may already be imported (from the ansible package); extend its search path.
    mod = sys.modules.get("ansible_collections")
    if mod is not None and hasattr(mod, "__path__"):
        target = str(root / "ansible_collections")
        if target not in list(mod.__path__):
            mod.__path__.append(target)
    return root
