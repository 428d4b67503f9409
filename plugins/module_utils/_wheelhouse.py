# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""The agent's wheelhouse on a node: its archive's digest, safe unpacking, wheel versions. PRIVATE.

Used by the hami_agent_install module; no subprocess here, so every function is unit-testable.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile

STAMP = ".hami-wheelhouse.sha256"


class WheelhouseError(Exception):
    """A problem with the archive itself (the message says what and how to fix it)."""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_stamp(venv):
    """The digest of the archive the venv was last installed from, or None."""
    try:
        with open(os.path.join(venv, STAMP), encoding="ascii") as fh:
            return fh.read().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_stamp(venv, digest):
    """Atomically (temp file + rename in the venv): a crash leaves the old stamp or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=STAMP + ".", dir=venv)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(digest + "\n")
        os.chmod(tmp, 0o644)
        os.rename(tmp, os.path.join(venv, STAMP))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _member_name(member):
    """The wheel's file name of a tar member; refuses anything but a plain file at the archive's top."""
    name = member.name[2:] if member.name.startswith("./") else member.name
    if member.isdir() and name in ("", "."):
        return None
    if not member.isfile() or "/" in name or name in ("", "..") or not name.endswith(".whl"):
        raise WheelhouseError(
            "the wheelhouse archive holds %r, not only wheel files at its top: pack a directory of "
            "*.whl files (pip wheel / pip download -d <dir>)" % member.name
        )
    return name


def unpack(archive, dest):
    """Unpack the archive's wheels into dest, each through a temp file and a rename; drop the wheels it lacks.

    File by file, not a new directory swapped in: renaming a directory fails with EXDEV on overlayfs when
    the directory comes from a lower layer (container images, the fleet benchmark's clones). A run that
    fails part way leaves no digest (see the module), so the next run unpacks again. Wheels of an earlier
    archive are removed: pip's --find-links would otherwise prefer a stale, newer version.
    """
    os.makedirs(dest, mode=0o755, exist_ok=True)
    names = []
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [(m, _member_name(m)) for m in tar.getmembers()]
            for member, name in members:
                if name is None:
                    continue
                fd, tmp = tempfile.mkstemp(prefix=".%s." % name, dir=dest)
                try:
                    with os.fdopen(fd, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(member), out)
                    os.chmod(tmp, 0o644)
                    os.rename(tmp, os.path.join(dest, name))
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                names.append(name)
    except tarfile.TarError as exc:
        msg = "%s is not a readable tar archive (%s): copy it again" % (archive, exc)
        raise WheelhouseError(msg) from None
    for stale in set(os.listdir(dest)) - set(names):
        path = os.path.join(dest, stale)
        if os.path.isfile(path) or os.path.islink(path):
            os.unlink(path)
    return sorted(names)


def wheel_versions(wheels, project):
    """The versions of project's wheels among the file names (PEP 427 names: dist-version-...whl)."""
    dist = re.sub(r"[-_.]+", "_", project).lower()
    versions = []
    for name in wheels:
        parts = name.split("-")
        if len(parts) >= 5 and parts[0].lower() == dist:
            versions.append(parts[1])
    return sorted(set(versions))


def pip_wheel(wheels):
    """The newest-looking pip wheel's file name, or None (the venv is made without ensurepip)."""
    found = [w for w in wheels if w.lower().startswith("pip-") and w.endswith(".whl")]
    return sorted(found)[-1] if found else None
