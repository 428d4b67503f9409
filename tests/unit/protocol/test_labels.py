"""``hami.io/vgpu-node`` label values stay valid for every node name (issue 21 item 4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_agent.protocol.labels import LABEL_VALUE_MAX, is_label_value, vgpu_node_label
from tests.sim.apiserver_meta import object_meta_errors

pytestmark = pytest.mark.unit

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
# RFC 1123 subdomains, as Kubernetes node names are: up to 253 characters of dot-separated labels
NODE_NAMES = st.lists(_LABEL, min_size=1, max_size=14).map(".".join).filter(lambda s: len(s) <= 253)


@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-0-1.ec2.internal", "n" * 63])
def test_a_name_that_is_a_valid_label_value_is_written_as_is_like_hami(node):
    assert vgpu_node_label(node) == node


def test_a_long_name_becomes_a_valid_value_that_keeps_its_start_and_is_unique():
    base = "gpu-node-pool-a100-80gb-europe-west4-b.compute.internal.example"  # 63 characters
    a, b = vgpu_node_label(base + "-01"), vgpu_node_label(base + "-02")
    assert len(a) == LABEL_VALUE_MAX and is_label_value(a) and a.startswith(base[:50])
    assert a != b and vgpu_node_label(base + "-01") == a  # deterministic, distinct for distinct names
    assert object_meta_errors({"labels": {"hami.io/vgpu-node": base + "-01"}})  # refused as is
    assert not object_meta_errors({"labels": {"hami.io/vgpu-node": a}})


def test_a_cut_that_ends_on_a_dot_or_dash_is_trimmed():
    node = "a" * 51 + "." + "b" * 40  # the 52-character cut would end with "."
    value = vgpu_node_label(node)
    assert is_label_value(value) and value.startswith("a" * 51 + "-")


@given(NODE_NAMES)
def test_every_node_name_gives_a_label_value_the_api_server_accepts(node):
    value = vgpu_node_label(node)
    assert is_label_value(value)
    assert not object_meta_errors({"labels": {"hami.io/vgpu-node": value}})
    assert (value == node) == (len(node) <= LABEL_VALUE_MAX)


@pytest.mark.parametrize("value, ok", [("", True), ("a", True), ("a-b_c.d", True), ("-a", False),
                                        ("a.", False), ("a b", False), ("x" * 64, False)])
def test_is_label_value_matches_the_api_server(value, ok):
    assert is_label_value(value) is ok
    assert (not object_meta_errors({"labels": {"k": value}})) is ok
