"""The node register annotation must advertise the mode the plugin serves, not the configured one.

Regression: with ``operatingmode: mig`` in the node config the plugin serves full GPUs in hami-core
mode (dynamic MIG is not implemented), but the registrar published ``mode: mig`` with MIG profiles, so
the scheduler could place pods the plugin cannot allocate.
"""

import argparse

import pytest

from hami_agent.deviceplugin import cmd
from hami_agent.deviceplugin.register import build_node_devices
from tests.unit.register.test_register import cfg, gpu, snap

pytestmark = pytest.mark.unit


def _settings(config):
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-name", default="gpu-1")
    cmd.add_arguments(parser)
    return cmd.build_settings(parser.parse_args([]), config)


def test_mig_operating_mode_is_served_and_registered_as_hami_core():
    config = cfg(node={"operatingmode": "mig"})
    settings = _settings(config)
    assert settings.mode == "hami-core"
    devices, _ = build_node_devices(snap(gpu(0), gpu(1)), config, settings.mode)
    assert [d.mode for d in devices] == ["hami-core", "hami-core"]
    assert all(not d.mig_profiles for d in devices)


def test_mps_operating_mode_is_served_and_registered_as_mps():
    config = cfg(node={"operatingmode": "mps"})
    settings = _settings(config)
    assert settings.mode == "mps"
    devices, _ = build_node_devices(snap(gpu(0)), config, settings.mode)
    assert [d.mode for d in devices] == ["mps"]
