# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""The Kubernetes side of the controller-side modules (hami_node, k8s_node_maintenance, k8s_rollout):
credentials, and a small JSON-in, JSON-out adapter over the official client. PRIVATE to hami.node.

Written once here so every module loads credentials the same way (kubeconfig, then KUBECONFIG /
~/.kube/config, then the in-cluster service account), bounds every request by ``api_timeout`` and turns
errors into one exception type whose message the modules put in front of the operator.
"""

from __future__ import annotations

import datetime
import json
import traceback

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.rest import ApiException

    HAS_K8S = True
    K8S_IMPORT_ERROR = None
except ImportError:  # the module fails with missing_required_lib()
    HAS_K8S = False
    K8S_IMPORT_ERROR = traceback.format_exc()
    k8s_client = k8s_config = None

    class ApiException(Exception):  # noqa: N818 - the client's name, so modules catch one type either way
        pass

# the options every controller-side module takes, for its argument_spec
CONNECTION_ARGS = dict(
    kubeconfig=dict(type="path"),
    context=dict(type="str"),
    api_timeout=dict(type="float", default=10),
)


class ApiError(Exception):
    """An HTTP error: status code, reason and the Status body (a dict)."""

    def __init__(self, status, reason="", body=None):
        super().__init__("%s %s" % (status, reason))
        self.status = status
        self.reason = reason
        self.body = body or {}

    @property
    def message(self):
        return self.body.get("message") or self.reason or str(self.status)

    def causes(self):
        details = self.body.get("details") or {}
        return [c.get("message", "") for c in details.get("causes") or []]

    def retry_after(self):
        details = self.body.get("details") or {}
        try:
            return float(details.get("retryAfterSeconds") or 0)
        except (TypeError, ValueError):
            return 0.0


def decode_json(text):
    """A JSON object from a response body; {} for anything else (an empty or non-JSON body)."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def require_client(module):
    """Fail the module with Ansible's standard message when the kubernetes client is missing."""
    if not HAS_K8S:
        from ansible.module_utils.basic import missing_required_lib

        module.fail_json(msg=missing_required_lib("kubernetes"), exception=K8S_IMPORT_ERROR)


def api_client(module, hint_var="kubeconfig"):
    """An ApiClient from the module's kubeconfig/context, else the default kubeconfig, else in-cluster."""
    p = module.params
    try:
        if p["kubeconfig"] or p["context"]:
            return k8s_config.new_client_from_config(config_file=p["kubeconfig"], context=p["context"])
        try:
            return k8s_config.new_client_from_config()
        except (k8s_config.ConfigException, OSError, TypeError):
            cfg = k8s_client.Configuration()
            k8s_config.load_incluster_config(client_configuration=cfg)
            return k8s_client.ApiClient(cfg)
    except (k8s_config.ConfigException, OSError) as exc:
        module.fail_json(
            msg="cannot load Kubernetes credentials (kubeconfig=%s, context=%s): %s; set %s or run where "
            "KUBECONFIG points at the cluster" % (p["kubeconfig"], p["context"], exc, hint_var))


class Api:
    """JSON in, JSON out, errors as ApiError; every request bounded by the module's ``api_timeout``."""

    def __init__(self, module, hint_var="kubeconfig"):
        client = api_client(module, hint_var)
        self.core = k8s_client.CoreV1Api(client)
        self.policy = k8s_client.PolicyV1Api(client)
        self.timeout = module.params["api_timeout"]
        self.requests = 0

    def _call(self, fn, *args, **kwargs):
        self.requests += 1
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            return decode_json(resp.data)
        except ApiException as exc:
            raise ApiError(exc.status, exc.reason or "", decode_json(exc.body)) from None
        except Exception as exc:  # noqa: BLE001 - urllib3: connection refused, read timeout
            raise ApiError(503, "cannot reach the API server: %s" % exc) from None

    def get_node(self, name):
        return self._call(self.core.read_node, name)

    def patch_node(self, name, patch):
        return self._call(self.core.patch_node, name, patch, _content_type="application/merge-patch+json")

    def list_nodes(self, label_selector=None):
        kw = {"label_selector": label_selector} if label_selector else {}
        return self._call(self.core.list_node, **kw).get("items") or []

    def list_pods(self, node=None):
        kw = {"field_selector": "spec.nodeName=%s" % node} if node else {}
        return self._call(self.core.list_pod_for_all_namespaces, **kw).get("items") or []

    def list_pdbs(self):
        return self._call(self.policy.list_pod_disruption_budget_for_all_namespaces).get("items") or []

    def evict(self, namespace, name, delete_options):
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace}}
        if delete_options:
            body["deleteOptions"] = delete_options
        return self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)

    def create_node_event(self, node, type_, reason, message):
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "%s." % node, "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": "hami.node"}, "reportingComponent": "hami.node",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        return self._call(self.core.create_namespaced_event, "default", body)
