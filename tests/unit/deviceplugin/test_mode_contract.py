"""The node register annotation must advertise the mode the plugin serves.

History: ``operatingmode: mig`` used to be served silently as hami-core (issue 21 item 4). Dynamic MIG
now serves it: the plugin runs in mig mode, and it registers only the MIG profiles its NVML discovery
found (allowlisted), never profiles guessed from names that it could not create.
"""

import argparse

import pytest

from hami_agent.deviceplugin import cmd
from hami_agent.deviceplugin.node_register import build_node_devices
from hami_agent.deviceplugin.settings import SettingsError
from hami_agent.protocol import MigPlacement, MigProfile
from tests.unit.register.test_register import cfg, gpu, snap

pytestmark = pytest.mark.unit


def _settings(config):
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-name", default="gpu-1")
    cmd.add_arguments(parser)
    return cmd.build_settings(parser.parse_args([]), config)


def test_mig_operating_mode_is_served_and_registered_as_mig():
    config = cfg(node={"operatingmode": "mig"})
    settings = _settings(config)
    assert settings.mode == "mig"
    settings.validate()
    prof = MigProfile("1g.10gb", 9728, 15, 1, (MigPlacement(0, 1), MigPlacement(1, 1)), instance_count=7)
    discovered = {gpu(0).uuid: (prof,)}
    devices, skipped = build_node_devices(snap(gpu(0), gpu(1)), config, settings.mode,
                                          lambda u: discovered.get(u, ()))
    assert [(d.id, d.mode, d.count, d.devcore, d.mig_profiles) for d in devices] == [
        (gpu(0).uuid, "mig", 7, 100, (prof,))]
    assert [s.uuid for s in skipped] == [gpu(1).uuid] and "no MIG profile discovered" in skipped[0].reason


def test_mig_mode_refuses_static_mig_strategies():
    config = cfg(node={"operatingmode": "mig", "migstrategy": "mixed"})
    with pytest.raises(SettingsError, match="mig-strategy none"):
        _settings(config).validate()


def test_mps_operating_mode_is_served_and_registered_as_mps():
    config = cfg(node={"operatingmode": "mps"})
    settings = _settings(config)
    assert settings.mode == "mps"
    devices, _ = build_node_devices(snap(gpu(0)), config, settings.mode)
    assert [d.mode for d in devices] == ["mps"]
