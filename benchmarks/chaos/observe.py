"""The soak's watcher: every ``interval_s`` it counts the NVML worker processes in /proc, restarts agents
that exited on their own (the agent records the crash), samples the agents' memory, and expires old
events in the API server.

NVML workers are counted per node and per agent (device plugin = ``--mode watch`` workers, monitor =
``--mode serve``), whoever their parent is now: a worker the previous device-plugin process left stuck in
the driver still counts against the device plugin of its node (the product's bound adopts such
orphans too). ``max_abandoned`` counts workers that were SIGKILLed and are still alive (SIGKILL pending:
stuck in state D); zombies (killed, not yet reaped) hold nothing and are not counted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.chaos.cluster import Cluster
from benchmarks.chaos.procs import WorkerInfo


@dataclass
class Peak:
    value: int = 0
    at: float = 0.0  # seconds after t0
    where: str = ""


@dataclass
class Watcher:
    cluster: Cluster
    interval_s: float = 0.5
    t0: float = 0.0
    samples: int = 0
    max_nvml: Peak = field(default_factory=Peak)  # NVML workers of one (node, agent)
    max_abandoned: Peak = field(default_factory=Peak)  # killed-but-alive workers of one (node, agent)
    max_d_state: int = 0  # workers in state D, whole run
    errors: list[str] = field(default_factory=list)
    events_expired: int = 0
    supervise: bool = True
    # pid -> (agent name, first seen at, first RSS MiB, last seen at, last RSS MiB): a leak shows as growth
    rss: dict[int, tuple[str, float, float, float, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _events_seen: dict = field(default_factory=dict)

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name="chaos-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        last_janitor = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
                if self.samples % 10 == 1:
                    self.sample_rss()
                if self.supervise:
                    for agent in self.cluster.agents():
                        agent.supervise()  # a crash is recorded on the agent and restarted
                api = self.cluster.api
                if api is not None and api.running and time.monotonic() - last_janitor > 30:
                    self.events_expired += api.expire_events(300.0, self._events_seen)
                    last_janitor = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive a bad sample
                self.errors.append(f"watcher: {exc!r}")

    def sample_rss(self) -> None:
        now = time.monotonic() - self.t0
        for agent in self.cluster.agents():
            pid = agent.pid
            mib = _rss_mib(pid) if pid and agent.running() else None
            if mib is None:
                continue
            first = self.rss.get(pid) or (agent.name, now, mib, now, mib)
            self.rss[pid] = (agent.name, first[1], first[2], now, mib)

    def rss_growth(self) -> dict[str, str]:
        """Per agent kind, its longest-lived process: RSS at first and last sample."""
        best: dict[str, tuple[str, float, float, float, float]] = {}
        for name, t1, m1, t2, m2 in self.rss.values():
            kind = name.split("/")[-1].rstrip("-0123456789") or name
            if kind not in best or t2 - t1 > best[kind][3] - best[kind][1]:
                best[kind] = (name, t1, m1, t2, m2)
        return {k: f"{v[2]:.0f}->{v[4]:.0f} MiB over {v[3] - v[1]:.0f}s ({v[0]})"
                for k, v in sorted(best.items())}

    def sample(self) -> list[WorkerInfo]:
        assert self.cluster.scanner is not None
        workers = [w for w in self.cluster.scanner.workers() if w.alive]
        self.samples += 1
        now = time.monotonic() - self.t0
        per = Counter((w.node, w.role) for w in workers)
        killed = Counter((w.node, w.role) for w in workers if w.sigkill_pending)
        for counter, peak in ((per, self.max_nvml), (killed, self.max_abandoned)):
            if counter:
                (node, role), n = counter.most_common(1)[0]
                if n > peak.value:
                    peak.value, peak.at, peak.where = n, round(now, 1), f"{node}/{role}"
        self.max_d_state = max(self.max_d_state, sum(1 for w in workers if w.state == "D"))
        return workers


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
