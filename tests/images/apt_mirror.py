#!/usr/bin/env python3
"""Print the Debian mirror URI this machine's apt sources use for a suite (stdlib only).

Reads /etc/apt/sources.list (one-line format) and /etc/apt/sources.list.d/*.list|*.sources (deb822), so
the image build uses whatever mirror the machine is configured for and no host name is written in the repo.
Exit 1 when no `deb` source with component `main` lists the suite.
"""

from __future__ import annotations

import glob
import sys


def _one_line(path: str, suite: str) -> str | None:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split("#", 1)[0].split()
            if len(parts) < 4 or parts[0] != "deb":
                continue
            # drop "[option=value ...]" blocks
            words = [p for p in parts[1:] if not (p.startswith("[") or p.endswith("]"))]
            if len(words) >= 3 and words[1] == suite and "main" in words[2:]:
                return words[0]
    return None


def _deb822(path: str, suite: str) -> str | None:
    with open(path, encoding="utf-8") as fh:
        stanzas = fh.read().split("\n\n")
    for stanza in stanzas:
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in fields.get("types", "").split():
            continue
        if suite in fields.get("suites", "").split() and "main" in fields.get("components", "").split():
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


def find_mirror(suite: str) -> str | None:
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            found = _one_line(path, suite)
        except OSError:
            continue
        if found:
            return found
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        found = _deb822(path, suite)
        if found:
            return found
    return None


if __name__ == "__main__":
    mirror = find_mirror(sys.argv[1] if len(sys.argv) > 1 else "bookworm")
    if not mirror:
        sys.exit(1)
    print(mirror)
