"""The fleet's light hosts: podman containers cloned from one converged node.

Design (docs/testing.md, "Fleet benchmark"):

1. **The golden node.** One node container of the sandbox's shape (``tests/images`` image, systemd as PID
   1, host network, the simulated NVIDIA apt repo, gpusim, a kubelet footprint from
   ``sandbox/playbooks/prepare.yml``) is converged with the real ``playbooks/site.yml`` (index 0 of the
   fleet's naming), checked to be converged by a second run (``changed=0``), stopped and committed to an
   image. The files in which it carries its identity (its name, its agent ports) are found by searching its
   ``/etc`` for them. Image + identity list + its gpusim state are cached under a key that hashes every
   input (roles, playbooks, plugins, agent, sandbox playbooks and group vars, the image scripts, ports).
2. **The clones.** Host ``i`` is created from that image, its identity files rewritten with its own name
   and ports (``podman mount``, before it boots), its gpusim state copied from the golden node's with GPU
   and MIG UUIDs of its own (``gpusim_state.personalize``); it boots
   with the agents as the golden node ran them. A converged run must then report ``changed=0`` on every
   host: the benchmark checks it.

Every container carries the label ``hami-fleet=1`` and lives under the cgroup parent ``/hami_fleet`` (so
the hosts' CPU and memory are one cgroup read); ``remove_all`` removes every container with the label.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fleet import inventory as inv
from benchmarks.procstat import process_start_and_cpu_s, thread_wakeups
from sandbox import podman
from sandbox.cluster import http_ok
from sandbox.config import APT_REPO, GPUSIM_DIR, IMAGE

REPO = inv.REPO
LABEL = "hami-fleet=1"
CGROUP_PARENT = "/hami_fleet"
GOLD_IMAGE = "localhost/hami-fleet-node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# what the golden node's convergence depends on: a change in any of these builds a new golden image
KEY_INPUTS = (
    "roles",
    "playbooks",
    "plugins",
    "agent/hami_agent",
    "agent/pyproject.toml",
    "pyproject.toml",
    "sandbox/playbooks",
    "sandbox/stub",
    "inventories/sandbox/group_vars",
    "tests/images",
    "tests/gpusim/src",
    "benchmarks/fleet/inventory.py",
)


class FleetError(RuntimeError):
    pass


def ulimits() -> tuple[str, ...]:
    """Explicit limits at or below the current hard ones (podman must not try to raise them). A fleet of
    containers running as root shares one RLIMIT_NPROC (processes and threads of uid 0, machine-wide),
    which the sandbox's 1000 would exhaust; on this machine runc refuses values above 32768."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 20000)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return ("--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}")


def input_key(extra: str = "", root: Path = REPO) -> str:
    """A hash of every file the golden node's convergence depends on (content, not mtime)."""
    h = hashlib.sha256(extra.encode())
    for top in KEY_INPUTS:
        base = root / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for p in files:
            if "__pycache__" in p.parts or p.suffix in (".pyc", ".so", ".o") or "build" in p.parts:
                continue
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Fleet:
    run_dir: Path
    base_port: int
    say: Callable[[str], None] = print

    # ------------------------------------------------------------------------------ paths
    def node_dir(self, name: str) -> Path:
        return self.run_dir / "nodes" / name

    def gpusim_dir(self, name: str) -> Path:
        return self.node_dir(name) / "etc-gpusim"

    def sysfs_dir(self, name: str) -> Path:
        return self.node_dir(name) / "run-gpusim"

    def device_plugin_dir(self, name: str) -> Path:
        return self.node_dir(name) / "device-plugins"

    def volumes(self, name: str) -> list[tuple[Path | str, str, str]]:
        return [
            (APT_REPO, "/srv/hami-apt", "ro"),
            (self.gpusim_dir(name), "/etc/gpusim", ""),
            (self.sysfs_dir(name), "/run/gpusim", ""),
            (self.device_plugin_dir(name), "/var/lib/kubelet/device-plugins", ""),
        ]

    def init_dirs(self, name: str) -> None:
        """Fresh node directories (an earlier run's gpusim state or kubelet sockets must not leak in)."""
        shutil.rmtree(self.node_dir(name), ignore_errors=True)
        for d in (self.gpusim_dir(name), self.sysfs_dir(name), self.device_plugin_dir(name)):
            d.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------ containers
    def create(self, name: str, image: str, start: bool) -> None:
        if podman.exists(name):
            if name not in podman.sandbox_containers(LABEL):
                raise FleetError(f"a container named {name} exists and is not a fleet container")
            podman.remove(name)
        podman.run_node(
            name,
            image,
            self.volumes(name),
            label=LABEL,
            ulimits=ulimits(),
            extra=("--cgroup-parent", CGROUP_PARENT),
            create_only=not start,
        )

    def gpusim_init(self, name: str, profile: str) -> None:
        state = self.gpusim_dir(name) / "state.json"
        proc = subprocess.run(
            [
                sys.executable,
                str(GPUSIM_DIR / "bin" / "gpusim"),
                "--state",
                str(state),
                "init",
                "--profile",
                profile,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise FleetError(f"gpusim init {name}: {proc.stderr.strip()}")
        # no driver until the packages install one (their postinst and the emulated module load fill it in)
        doc = json.loads(state.read_text())
        doc.update({"driver_loaded": False, "module_version": None, "driver_version": None})
        state.write_text(json.dumps(doc, indent=2) + "\n")

    def personalize_gpusim(self, name: str) -> None:
        """Give a clone's copied gpusim state GPU and MIG UUIDs of its own (``gpusim init --node`` does the
        same for the sandbox): a fleet whose nodes all report the golden node's UUIDs is no real fleet."""
        from tests.gpusim.gpusim_state import personalize

        state = self.gpusim_dir(name) / "state.json"
        doc = personalize(json.loads(state.read_text()), name)
        state.write_text(json.dumps(doc, indent=2) + "\n")

    def find_identity_files(self, name: str, tokens: Iterable[str]) -> list[str]:
        """Files under the container's /etc and /opt/hami-agent (not its venv) that mention a token."""
        mnt = podman.cli("mount", name, timeout_s=60).stdout.strip()
        found = []
        try:
            for top in ("etc", "opt/hami-agent"):
                for p in sorted(Path(mnt, top).rglob("*")):
                    if "venv" in p.parts or "wheelhouse" in p.parts or p.is_symlink() or not p.is_file():
                        continue
                    if p.stat().st_size > 1 << 20:
                        continue
                    data = p.read_bytes()
                    if any(t.encode() in data for t in tokens):
                        found.append("/" + str(p.relative_to(mnt)))
        finally:
            podman.cli("umount", name, timeout_s=60, check=False)
        return found

    def patch_identity(self, name: str, files: list[str], replace: dict[str, str]) -> None:
        """Rewrite ``files`` in the (created, not started) container with the host's own identity."""
        mnt = podman.cli("mount", name, timeout_s=60).stdout.strip()
        try:
            for f in files:
                p = Path(mnt + f)
                data = p.read_bytes()
                for old, new in replace.items():
                    data = data.replace(old.encode(), new.encode())
                st = p.stat()
                p.write_bytes(data)
                os.chmod(p, st.st_mode & 0o7777)
        finally:
            podman.cli("umount", name, timeout_s=60, check=False)

    def start(self, names: list[str], batch: int = 10) -> None:
        for k in range(0, len(names), batch):
            podman.cli("start", *names[k : k + batch], timeout_s=60 + 20 * batch)

    def wait_booted(self, names: list[str], timeout_s: float = 300) -> None:
        """systemd up in every container (right after the start, ``systemctl`` cannot reach its bus yet:
        retried until the deadline)."""
        end = time.monotonic() + timeout_s
        for n in names:
            while True:
                left = end - time.monotonic()
                try:
                    podman.wait_booted(n, timeout_s=max(5.0, min(60.0, left)))
                    break
                except podman.PodmanError:
                    if left <= 0:
                        raise
                    time.sleep(1.0)

    def nsenter_map(self, names: list[str]) -> dict[str, dict]:
        """name -> {pid, env, cgroups}: what the fleet_nsenter connection needs, from one podman inspect."""
        out: dict[str, dict] = {}
        for k in range(0, len(names), 50):
            docs = json.loads(
                podman.cli("inspect", "--format", "json", *names[k : k + 50], timeout_s=120).stdout
            )
            for d in docs:
                pid = int(d["State"]["Pid"])
                name = d["Name"].lstrip("/")
                out[name] = {"pid": pid, "env": env_of(d), "cgroups": container_cgroups(pid)}
        return out

    def wait_http(self, urls: list[str], timeout_s: float) -> list[str]:
        """The URLs that did not answer 2xx within the deadline (all are polled together)."""
        pending = list(urls)
        end = time.monotonic() + timeout_s
        while pending and time.monotonic() < end:
            pending = [u for u in pending if not http_ok(u)]
            if pending:
                time.sleep(1.0)
        return pending

    def remove_all(self) -> list[str]:
        """Remove every container with the fleet's label (a batch ``rm`` can leave some behind: retried
        one by one)."""
        names = podman.sandbox_containers(LABEL)
        for k in range(0, len(names), 20):
            podman.cli("rm", "-f", "-t", "3", *names[k : k + 20], timeout_s=300, check=False)
        for _ in range(3):
            left = podman.sandbox_containers(LABEL)
            if not left:
                break
            for n in left:
                podman.cli("rm", "-f", "-t", "3", n, timeout_s=120, check=False)
        return names


# systemd, journald and dbus of each container hold inotify instances of uid 0, which the kernel counts
# machine-wide (fs.inotify.max_user_instances, often 128): past ~30 containers the next ones' path units
# fail ("Result: resources") and their boot stalls in "initializing".
INOTIFY_PER_HOST = 8


def inotify_needed(n_hosts: int) -> int:
    return 256 + INOTIFY_PER_HOST * n_hosts


def inotify_limit() -> int | None:
    try:
        return int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except (OSError, ValueError):
        return None


def env_of(inspect_doc: dict) -> dict[str, str]:
    env = {}
    for item in (inspect_doc.get("Config") or {}).get("Env") or []:
        k, _, v = item.partition("=")
        env[k] = v
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.setdefault("HOME", "/root")
    return env


def container_cgroups(pid: int) -> list[str]:
    """The container's cgroup directories on the host, one per v1 hierarchy (or the v2 one): where
    ``podman exec`` puts a process. PID 1's own paths, without the ``init.scope`` systemd moves itself to."""
    paths = []
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for suffix in ("/init.scope",):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        if controllers == "":
            d = CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified").is_dir() else CGROUP_ROOT
        elif controllers.startswith("name="):
            d = CGROUP_ROOT / controllers[5:]
        else:
            d = CGROUP_ROOT / controllers
        if not d.is_dir():
            d = CGROUP_ROOT / controllers.split(",")[0]
        full = d / path.lstrip("/")
        if (full / "cgroup.procs").exists():
            paths.append(str(full))
    return paths


def cgroup_cpu_s(parent: str = CGROUP_PARENT) -> float | None:
    """CPU seconds used so far by every container under the fleet's cgroup parent (cgroup v1 cpuacct)."""
    p = CGROUP_ROOT / "cpuacct" / parent.lstrip("/") / "cpuacct.usage"
    try:
        return int(p.read_text()) / 1e9
    except (OSError, ValueError):
        return None


def cgroup_wakeups(parent: str = CGROUP_PARENT, root: Path = CGROUP_ROOT) -> int:
    """Voluntary context switches so far of every thread in the fleet's containers (cgroup v1 ``tasks``
    files under the parent, each thread read by :func:`benchmarks.procstat.thread_wakeups`): the hosts' own
    wakeups, which unlike their CPU do not depend on what the machine charges per wakeup
    (docs/performance.md). Threads that ended are not counted."""
    return sum(thread_wakeups(tid) for tid in _listed_ids(parent, root, "tasks"))


def _listed_ids(parent: str, root: Path, listing: str) -> Iterator[str]:
    """The ids in every cgroup v1 cpuacct ``listing`` file (``tasks``: threads, ``cgroup.procs``:
    processes) under the parent; a cgroup removed while being read lists nothing."""
    for path in (root / "cpuacct" / parent.lstrip("/")).rglob(listing):
        try:
            yield from path.read_text().split()
        except OSError:
            continue


def cgroup_memory_bytes(parent: str = CGROUP_PARENT) -> dict[str, int]:
    """rss / cache / total of the fleet's containers (cgroup v1 memory.stat, hierarchical totals)."""
    p = CGROUP_ROOT / "memory" / parent.lstrip("/") / "memory.stat"
    out = {}
    try:
        for line in p.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k in ("total_rss", "total_cache", "total_shmem", "total_mapped_file"):
                out[k[6:]] = int(v)
    except (OSError, ValueError):
        pass
    return out


def copy_dir(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)


def cgroup_processes_cpu(
    parent: str = CGROUP_PARENT, root: Path = CGROUP_ROOT
) -> dict[tuple[int, int], float]:
    """(pid, start time) -> CPU seconds so far of every live process in the fleet's containers (cgroup v1
    ``cgroup.procs`` files under the parent). Two snapshots around a run tell the hosts' daemons (the agents,
    systemd, journald: alive at both) from the run's modules (started and ended between them), which share
    one cgroup per container: systemd inside a container does not get a cpuacct hierarchy of its own."""
    out: dict[tuple[int, int], float] = {}
    for pid in _listed_ids(parent, root, "cgroup.procs"):
        try:
            start, cpu = process_start_and_cpu_s(pid)
        except (OSError, ValueError, IndexError):
            continue  # ended since the list was read
        out[(int(pid), start)] = cpu
    return out


def daemons_cpu_s(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float]) -> float:
    """CPU seconds the processes alive at both snapshots (:func:`cgroup_processes_cpu`) used between them:
    the hosts' background during a run, measured instead of extrapolated from an idle window before it."""
    return sum(max(0.0, after[k] - before[k]) for k in after.keys() & before.keys())


__all__ = [
    "Fleet",
    "FleetError",
    "GOLD_IMAGE",
    "IMAGE",
    "LABEL",
    "cgroup_cpu_s",
    "cgroup_memory_bytes",
    "cgroup_processes_cpu",
    "cgroup_wakeups",
    "copy_dir",
    "daemons_cpu_s",
    "input_key",
]

