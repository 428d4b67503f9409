"""module_utils._kubelet: comment-preserving merge, header validation, flag-override detection."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.hami.node.plugins.module_utils import _kubelet

pytestmark = pytest.mark.unit

# Abridged from seed 003's /etc/kubernetes/kubelet-config.yaml (kubespray), with its comment.
SEED_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: "10s"
failSwapOn: True
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: True
  x509:
    clientCAFile: /etc/kubernetes/ssl/ca.crt
authorization:
  mode: Webhook
staticPodPath: /etc/kubernetes/manifests
cgroupDriver: systemd
maxPods: 110   # per node
clusterDNS:
- 10.199.0.3
resolvConf: "/run/systemd/resolve/resolv.conf"
shutdownGracePeriod: 60s
"""


def test_merge_keeps_comments_order_and_untouched_lines():
    settings = {
        "maxPods": 64,
        "logging": {"verbosity": 4},
        "authentication": {"webhook": {"cacheTTL": "2m0s"}},
    }
    new, merged, lossless = _kubelet.edit_text(SEED_CONFIG, settings, yaml)
    assert lossless
    assert "maxPods: 64   # per node" in new
    assert 'nodeStatusUpdateFrequency: "10s"' in new and "failSwapOn: True" in new  # untouched bytes
    assert "    cacheTTL: 2m0s" in new.splitlines()[new.splitlines().index("  webhook:") + 2]
    assert new.rstrip().endswith("logging:\n  verbosity: 4")
    assert yaml.safe_load(new) == merged and merged["logging"] == {"verbosity": 4}
    # Order of the original keys is unchanged.
    keys = [line.split(":")[0] for line in new.splitlines() if line and not line.startswith((" ", "-"))]
    assert keys[:4] == ["apiVersion", "kind", "nodeStatusUpdateFrequency", "failSwapOn"]


def test_merge_is_idempotent():
    settings = {"maxPods": 64, "logging": {"verbosity": 4}}
    once, _, _ = _kubelet.edit_text(SEED_CONFIG, settings, yaml)
    twice, _, lossless = _kubelet.edit_text(once, settings, yaml)
    assert twice == once and lossless


def test_lists_replace_and_flow_mappings_are_rewritten():
    text = (
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nlogging: {format: text}\n"
        "clusterDNS:\n- 10.0.0.1\n- 10.0.0.2\n"
    )
    new, merged, lossless = _kubelet.edit_text(
        text, {"logging": {"verbosity": 5}, "clusterDNS": ["10.0.0.9"]}, yaml
    )
    assert lossless
    assert merged["logging"] == {"format": "text", "verbosity": 5}
    assert merged["clusterDNS"] == ["10.0.0.9"]
    assert "10.0.0.1" not in new


def test_strings_that_look_like_other_types_are_quoted():
    new, merged, lossless = _kubelet.edit_text(
        SEED_CONFIG,
        {"cpuCFSQuotaPeriod": "100ms", "evictionHard": {"memory.available": "100Mi"}, "x": "true"},
        yaml,
    )
    assert lossless and merged["x"] == "true" and yaml.safe_load(new)["x"] == "true"


def test_flow_style_document_falls_back_to_full_dump():
    text = "{apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration, maxPods: 10}\n"
    new, merged, lossless = _kubelet.edit_text(text, {"maxPods": 20}, yaml)
    assert not lossless and yaml.safe_load(new) == merged and merged["maxPods"] == 20


def test_header_validation_names_the_fix():
    with pytest.raises(_kubelet.EditError, match="expected kind KubeletConfiguration"):
        _kubelet.validate_header({"apiVersion": "v1", "kind": "Pod"}, "/x.yaml")
    _kubelet.validate_header(yaml.safe_load(SEED_CONFIG), "/x.yaml")


def test_find_flags_kubespray_and_kubeadm():
    kubespray = (
        'KUBE_LOGTOSTDERR="--logtostderr=true"\nKUBE_LOG_LEVEL="--v=2"\n'
        'KUBELET_ARGS="--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf '
        '--config=/etc/kubernetes/kubelet-config.yaml --max-pods=200"\n'
    )
    found = _kubelet.find_flags(kubespray, "/etc/kubernetes/kubelet.env", ["maxPods"])
    assert {(f["variable"], f["flag"], f["setting"]) for f in found} == {
        ("KUBE_LOG_LEVEL", "--v=2", "logging.verbosity"),
        ("KUBELET_ARGS", "--max-pods=200", "maxPods"),
    }
    kubeadm = (
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock -v 10"\n'
    )
    found = _kubelet.find_flags(kubeadm, "/var/lib/kubelet/kubeadm-flags.env", [])
    assert [(f["variable"], f["value"]) for f in found] == [("KUBELET_KUBEADM_ARGS", "10")]
    assert _kubelet.find_flags('# KUBE_LOG_LEVEL="--v=2"\n', "f", []) == []
    # --vmodule must not be taken for --v.
    assert _kubelet.find_flags('KUBELET_ARGS="--vmodule=x=4"\n', "f", []) == []


def test_set_verbosity_flag_rewrites_only_v():
    text = 'KUBE_LOG_LEVEL="--v=2"\nKUBELET_ARGS="--node-ip=10.0.0.1 --v=3"\n# KUBE_LOG_LEVEL="--v=9"\n'
    out = _kubelet.set_verbosity_flag(text, 4)
    assert (
        out == 'KUBE_LOG_LEVEL="--v=4"\nKUBELET_ARGS="--node-ip=10.0.0.1 --v=4"\n# KUBE_LOG_LEVEL="--v=9"\n'
    )


def test_camel_to_flag():
    assert _kubelet.camel_to_flag("maxPods") == "--max-pods"
    assert _kubelet.camel_to_flag("cgroupDriver") == "--cgroup-driver"
