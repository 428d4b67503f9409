# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Small helpers shared by the hami.node modules. PRIVATE to the collection."""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.common.text.converters import to_bytes


def atomic_write(module, path, content, backup=False, mode=None):
    """Write text via a temp file in the target directory + module.atomic_move. Returns backup path or None.

    The temp file lives next to the target so the final rename stays on one filesystem (atomic).
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        module.fail_json(
            msg="Directory %s of %s does not exist; create it first (ansible.builtin.file "
            "state=directory)." % (directory, path)
        )
    backup_file = None
    if backup and os.path.exists(path):
        backup_file = module.backup_local(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(to_bytes(content))
        if mode is not None:
            os.chmod(tmp, mode)
        elif os.path.exists(path):
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        module.atomic_move(tmp, os.path.abspath(path))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return backup_file


def read_text(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
