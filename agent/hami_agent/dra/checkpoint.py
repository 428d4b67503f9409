"""Prepared claims, on disk, so a restarted driver still knows them.

The kubelet calls NodePrepareResources again for running pods after it restarts and
NodeUnprepareResources whenever it likes (both must be idempotent), and our over-commit check needs the
claims prepared earlier. So every successful prepare/unprepare ends with one atomic rewrite of
``<state-dir>/checkpoint.json`` (temporary file, fsync, rename; mode 0600): ``{"version": 1,
"claims": {uid: PreparedClaim}, "checksum": sha256 of the claims}``.

A file that does not parse or whose checksum does not match is moved aside (``checkpoint.json.corrupt``)
and the driver starts with no prepared claims, logging the error: running containers keep their CDI edits,
and the over-commit check counts only what is prepared from then on (docs/dra.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from hami_agent.dra.cdi import CdiDevice

logger = logging.getLogger(__name__)

VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    uuid: str
    memory_mib: int  # consumed (the HAMi-core limit); for MIG the instance's memory
    cores: int  # consumed percent; 0 for MIG
    share_id: str | None = None
    cdi_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)
    # the CDI devices written for it, kept so a repeated prepare rewrites the very same spec
    cdi: tuple[CdiDevice, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name,
                "devices": [asdict(d) for d in self.devices],
                "cdi": [{"name": c.name, "env": dict(c.env), "mounts": [list(m) for m in c.mounts]}
                        for c in self.cdi]}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> PreparedClaim:
        devs = tuple(PreparedDevice(**{**d, "cdi_ids": tuple(d.get("cdi_ids") or ())})
                     for d in obj["devices"])
        cdi = tuple(CdiDevice(c["name"], dict(c["env"]), tuple((m[0], m[1], bool(m[2])) for m in c["mounts"]))
                    for c in obj.get("cdi") or ())
        return PreparedClaim(uid=obj["uid"], namespace=obj["namespace"], name=obj["name"], devices=devs,
                             cdi=cdi)


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Checkpoint:
    def __init__(self, path: str) -> None:
        self.path = path
        self.error: str | None = None  # what loading found wrong, for /healthz and the log
        self._json: dict[str, tuple[PreparedClaim, dict[str, Any]]] = {}  # uid -> (claim, its JSON)

    def load(self) -> dict[str, PreparedClaim]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            return self._corrupt(f"cannot read {self.path}: {exc}")
        try:
            claims = doc["claims"]
            if doc.get("version") != VERSION:
                return self._corrupt(f"{self.path}: unsupported version {doc.get('version')!r}")
            if doc.get("checksum") != _checksum(claims):
                return self._corrupt(f"{self.path}: checksum mismatch (the file was changed or cut short)")
            return {uid: PreparedClaim.from_json(c) for uid, c in claims.items()}
        except (KeyError, TypeError, AttributeError) as exc:
            return self._corrupt(f"{self.path}: unexpected content ({type(exc).__name__}: {exc})")

    def _corrupt(self, why: str) -> dict[str, PreparedClaim]:
        self.error = why
        aside = self.path + ".corrupt"
        try:
            os.replace(self.path, aside)
        except OSError:
            aside = "(could not move it aside)"
        logger.error("DRA checkpoint is corrupt: %s; moved to %s and starting with no prepared claims "
                     "(running containers keep their devices; see docs/dra.md)", why, aside)
        return {}

    def store(self, claims: dict[str, PreparedClaim]) -> None:
        # on the prepare path: claims are immutable, so their JSON is built once, and the document is
        # serialized with json.dumps (the C encoder; json.dump to a file is the slow pure-Python one)
        cache = self._json
        data = {}
        for uid, c in sorted(claims.items()):
            hit = cache.get(uid)
            data[uid] = hit[1] if hit is not None and hit[0] is c else c.to_json()
        self._json = {uid: (c, data[uid]) for uid, c in claims.items()}
        doc = {"version": VERSION, "claims": data, "checksum": _checksum(data)}
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(doc, sort_keys=True))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
