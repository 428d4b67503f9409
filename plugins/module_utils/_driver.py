# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""Installed (package) and loaded (kernel module) NVIDIA driver versions. PRIVATE to hami.node.

The loaded version comes from ``<sysfs_root>/module/nvidia/version`` (``/sys`` by default). The sysfs root
is an option so tests and gpusim containers can point it at a fake tree (gpusim's dummy packages install
``module/nvidia/version`` under their own root); env ``HAMI_SYSFS_ROOT`` is the fallback.
"""

from __future__ import annotations

import os
import re

# Most specific first: the package that ships libnvidia-ml / the kernel module decides the version.
PACKAGE_PATTERNS = (
    "libnvidia-compute-*",
    "nvidia-driver-*",
    "nvidia-utils-*",
    "nvidia-compute-utils-*",
    "nvidia-headless-*",
    "cuda-drivers*",
)
_PREF = ("libnvidia-compute-", "nvidia-driver-", "nvidia-headless-", "nvidia-utils-", "cuda-drivers")
_UPSTREAM = re.compile(r"^(?:\d+:)?(\d+\.\d+(?:\.\d+)?)")


def sysfs_root(option_value=None):
    return option_value or os.environ.get("HAMI_SYSFS_ROOT") or "/sys"


def loaded_version(root):
    """Version of the loaded nvidia kernel module, or None when it is not loaded."""
    path = os.path.join(root, "module", "nvidia", "version")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def upstream_version(pkg_version):
    """'570.172.08-0ubuntu1' -> '570.172.08'."""
    m = _UPSTREAM.match(pkg_version or "")
    return m.group(1) if m else None


def branch_of(version):
    if not version:
        return None
    return str(version).split(".", 1)[0]


def parse_dpkg_query(text):
    """Lines '<package>\\t<version>\\t<status abbrev>' -> {package: version} for installed ('ii') ones."""
    pkgs = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        name, version, status = parts[0], parts[1], parts[2]
        if status.startswith("ii") and version:
            pkgs[name] = version
    return pkgs


def installed_from_packages(pkgs):
    """Pick the driver's installed upstream version from {package: debian_version}."""
    for prefix in _PREF:
        for name in sorted(pkgs):
            if name.startswith(prefix):
                ver = upstream_version(pkgs[name])
                if ver:
                    return ver, name
    return None, None


def query_packages(module, timeout_s, runner):
    """Installed NVIDIA packages via dpkg-query (Debian/Ubuntu) or rpm (EL). Returns {name: version}."""
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg:
        res = runner(
            [dpkg, "-W", "-f", "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"] + list(PACKAGE_PATTERNS),
            timeout_s,
        )
        # rc 1 only means one pattern matched nothing.
        return parse_dpkg_query(res.out)
    rpm = module.get_bin_path("rpm")
    if rpm:
        res = runner(
            [
                rpm,
                "-qa",
                "--qf",
                "%{NAME}\\t%{VERSION}\\tii\\n",
                "nvidia-driver*",
                "cuda-drivers*",
                "libnvidia-compute*",
            ],
            timeout_s,
        )
        return parse_dpkg_query(res.out)
    return {}
