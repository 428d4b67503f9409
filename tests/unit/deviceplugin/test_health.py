import pytest

from hami_agent.deviceplugin.devices import plan_resources
from hami_agent.deviceplugin.health import HealthTracker
from hami_agent.deviceplugin.settings import PluginSettings
from tests.clock import ManualClock
from tests.unit.deviceplugin.fakes import FakeSnapshot, full_gpus

pytestmark = pytest.mark.unit


def plan(status="ok", gen=1, healthy=True):
    gpus = full_gpus(1, healthy=healthy)
    return plan_resources(
        FakeSnapshot(status=status, gpus=gpus, generation=gen),
        PluginSettings(node_name="n", device_split_count=2),
    )["nvidia.com/gpu"]


def states(p):
    return [d.healthy for d in p.devices]


def test_unhealthy_at_once_healthy_only_after_quiet_period_and_fresh_probe():
    clock = ManualClock()
    h = HealthTracker(quiet_s=30, clock=clock)
    assert states(h.apply(plan(gen=1), 1, True)) == [True, True]
    assert states(h.apply(plan("stuck", 2), 2, False)) == [False, False]
    clock.t += 10
    # NVML answers again, but the quiet period has not passed
    out = h.apply(plan(gen=3), 3, True)
    assert states(out) == [False, False] and "recovering" in out.devices[0].reason
    clock.t += 21
    assert states(h.apply(plan(gen=3), 3, True)) == [True, True]
    assert h.pending_recoveries() == 0


def test_no_recovery_without_a_successful_probe_newer_than_the_failure():
    clock = ManualClock()
    h = HealthTracker(quiet_s=1, clock=clock)
    h.apply(plan("stuck", 5), 5, False)
    clock.t += 100
    assert states(h.apply(plan(gen=5), 5, True)) == [False, False]  # same generation: no new probe
    assert states(h.apply(plan(gen=6), 6, False)) == [False, False]  # probe not ok
    assert states(h.apply(plan(gen=7), 7, True)) == [True, True]


def test_flapping_restarts_the_quiet_period():
    clock = ManualClock()
    h = HealthTracker(quiet_s=10, clock=clock)
    h.apply(plan(healthy=False, gen=1), 1, True)
    clock.t += 8
    h.apply(plan(healthy=False, gen=2), 2, True)  # bad again
    clock.t += 8
    assert states(h.apply(plan(gen=3), 3, True)) == [False, False]
    clock.t += 3
    assert states(h.apply(plan(gen=4), 4, True)) == [True, True]
