"""XID policy: NVIDIA/HAMi ignore list and the DP_*_HEALTHCHECKS variables."""

from __future__ import annotations

import pytest

from hami_agent.nvml.health import DEFAULT_IGNORED_XIDS, XidPolicy

pytestmark = pytest.mark.unit


def test_default_ignore_list() -> None:
    policy = XidPolicy.from_env({})
    assert DEFAULT_IGNORED_XIDS == {13, 31, 43, 45, 68, 109}
    assert not any(policy.is_critical(x) for x in DEFAULT_IGNORED_XIDS)
    assert all(policy.is_critical(x) for x in (48, 63, 64, 74, 79, 92, 94, 95))


@pytest.mark.parametrize("value", ["all", "xids", "ALL"])
def test_disable_all(value: str) -> None:
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": value})
    assert not policy.is_critical(79)


def test_disable_extra_xids_and_force_enable() -> None:
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "79, 48"})
    assert not policy.is_critical(79) and not policy.is_critical(48) and policy.is_critical(94)
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "79,13"})
    assert policy.is_critical(79) and policy.is_critical(13) and not policy.is_critical(31)
    policy = XidPolicy.from_env({"DP_ENABLE_HEALTHCHECKS": "all"})
    assert all(policy.is_critical(x) for x in DEFAULT_IGNORED_XIDS)


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="DP_DISABLE_HEALTHCHECKS: 'seventy' is not an XID number"):
        XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "seventy"})
