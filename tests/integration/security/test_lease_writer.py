"""Whoever can write the scheduler's Lease cannot redirect kube-scheduler's calls (issue 27 item 4).

Before: a Lease writer set ``holderIdentity`` and ``hami.io/extender-url: http://<anywhere>``; every replica
became a follower and sent kube-scheduler's /filter and /bind bodies to that URL in clear text, ignoring
``--forward-ca-file``, and handed the answers back to kube-scheduler. Here a follower runs with the
scheduler's own token against an API server that enforces RBAC; an identity with Lease rights in
kube-system (as many controllers have) rewrites the Lease, pointing it at a trap that records every
request: clear text, a certificate of another CA, and a certificate of the replicas' CA that does not name
the Lease holder. Each time the follower answers 503, records a ``ForwardingRefused`` event on the Lease,
reports not ready, and the trap receives nothing. And the scheduler's own credential may write only its
own Lease."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import uuid

import pytest

from hami_agent.k8s.client import KubeClient, RetryPolicy
from hami_agent.scheduler.serve.app import SchedulerApp
from hami_agent.scheduler.serve.server import ExtenderHTTPServer
from hami_agent.scheduler.verbs.extender import SchedulerConfig
from hami_agent.scheduler.verbs.leadership import URL_ANNOTATION, ForwardSettings
from tests.integration.scheduler.pki import issue, make_pki
from tests.integration.security.conftest import SA_NS, SecureCluster
from tests.sim.apiserver_auth import user
from tests.unit.scheduler.helpers import gpu_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{SA_NS}/leases"
# a controller's Lease rights in kube-system (kube-controller-manager, cloud controllers, operators)
LEASE_WRITER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": "some-controller-leases", "namespace": SA_NS},
    "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
               "verbs": ["get", "create", "update", "patch"]}]}
LEASE_WRITER_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": "some-controller-leases", "namespace": SA_NS},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "some-controller-leases"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "some-controller"}]}
UNVERIFIED = ssl.create_default_context()
UNVERIFIED.check_hostname = False
UNVERIFIED.verify_mode = ssl.CERT_NONE


def wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


class Trap:
    """An extender look-alike that records every request it receives (and would answer it)."""

    def __init__(self, cert: str | None = None, key: str | None = None) -> None:
        self.calls: list[dict] = []

        def record(body):
            self.calls.append(body)
            return {"NodeNames": ["attacker-chosen"], "Error": ""}

        self.srv = ExtenderHTTPServer(routes={"/filter": record, "/bind": record}, cert_file=cert,
                                      key_file=key).start()
        self.url = self.srv.url

    def stop(self) -> None:
        self.srv.stop()


def write_lease(cluster: SecureCluster, holder: str, url: str) -> None:
    """What the Lease writer does: name a holder and a URL, with a long duration so the follower waits."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    code, lease = cluster.call("writer", "GET", f"{LEASES}/hami-scheduler")
    body = lease if code == 200 else {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                      "metadata": {"name": "hami-scheduler", "namespace": SA_NS}}
    body.setdefault("metadata", {}).setdefault("annotations", {})[URL_ANNOTATION] = url
    body["spec"] = {"holderIdentity": holder, "leaseDurationSeconds": 3600, "acquireTime": now,
                    "renewTime": now, "leaseTransitions": 1}
    if code == 200:
        code, out = cluster.call("writer", "PUT", f"{LEASES}/hami-scheduler", body)
        assert code == 200, out
    else:
        code, out = cluster.call("writer", "POST", LEASES, body)
        assert code == 201, out


def post_filter(url: str) -> tuple[int, dict]:
    pod = gpu_pod("p", uid=str(uuid.uuid4()), mem=1000)
    body = json.dumps({"Pod": pod, "NodeNames": ["gpu-0"]}).encode()
    req = urllib.request.Request(url + "/filter", data=body, headers={"Content-Type": "application/json"},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30, context=UNVERIFIED) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def readyz(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5, context=UNVERIFIED) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def refusal_events(cluster: SecureCluster) -> list[dict]:
    return [e for e in cluster.api.list("events", SA_NS) if e.get("reason") == "ForwardingRefused"]


def test_a_lease_writer_cannot_redirect_kube_schedulers_calls(cluster: SecureCluster, tmp_path):
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    rogue_server = issue(tmp_path / "pki", pki.rogue_ca, "rogue-server", "hami-scheduler", server=True)
    cluster.api.apply(LEASE_WRITER_ROLE, LEASE_WRITER_BINDING)
    cluster.who["writer"] = cluster.tokens.add_user(user("some-controller"))
    plain, rogue = Trap(), Trap(rogue_server.cert, rogue_server.key)
    wrong_name = Trap(pki.server.cert, pki.server.key)  # the replicas' CA, but it names 127.0.0.1
    write_lease(cluster, "attacker", plain.url)  # before the replica starts: it follows from the outset

    client = KubeClient.from_kubeconfig(cluster.kubeconfig("scheduler"), timeout_s=5,
                                        retry=RetryPolicy(attempts=2, base_s=0.05, cap_s=0.2))
    follower = SchedulerApp(client, SchedulerConfig(), cert_file=pki.server.cert, key_file=pki.server.key,
                            leader_elect=True, lease_namespace=SA_NS, register_interval_s=0.5,
                            forward=ForwardSettings(ca_file=pki.ca.cert),
                            leader_kwargs={"lease_duration_s": 30.0, "renew_deadline_s": 20.0,
                                           "retry_period_s": 0.3})
    follower.start()
    try:
        assert wait(lambda: follower.sync.synced() and follower.elector.leader() == "attacker", 20)
        cases = [("attacker", plain, "is not https"),
                 (f"attacker_{uuid.uuid4()}", rogue, "does not verify"),
                 (f"control-9_{uuid.uuid4()}", wrong_name, "does not verify against --forward-ca-file for "
                                                           "control-9")]
        for n, (holder, trap, why) in enumerate(cases, 1):
            write_lease(cluster, holder, trap.url)
            assert wait(lambda h=holder: follower.elector.leader() == h, 10)
            code, body = post_filter(follower.url)
            assert code == 503, (code, body)
            assert why in body["error"] and "nothing was sent" in body["error"], body
            assert trap.calls == [], trap.calls  # not one byte of kube-scheduler's request
            assert readyz(follower.url) == 503  # the Service takes it out while it cannot forward
            assert wait(lambda n=n: len(refusal_events(cluster)) >= n, 10), refusal_events(cluster)
        ev = refusal_events(cluster)[0]
        assert ev["type"] == "Warning" and ev["involvedObject"]["kind"] == "Lease"
        assert ev["involvedObject"]["name"] == "hami-scheduler" and "refused to forward" in ev["message"]
        assert plain.calls == rogue.calls == wrong_name.calls == []
        assert follower.gate.refused >= 3 and follower.gate.forwarded == 0
    finally:
        follower.stop()
        client.close()
        for t in (plain, rogue, wrong_name):
            t.stop()


def test_the_schedulers_credential_writes_only_its_own_lease(cluster: SecureCluster):
    """The scheduler's Lease rights are a Role in its namespace, by name, plus create: it cannot take over
    another controller's Lease, nor read or write Leases elsewhere."""
    other = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "kube-controller-manager", "namespace": SA_NS},
             "spec": {"holderIdentity": "kcm-1", "leaseDurationSeconds": 15}}
    cluster.api.create(other)
    code, body = cluster.call("scheduler", "GET", f"{LEASES}/kube-controller-manager")
    assert code == 403, body
    obj = cluster.api.get("Lease", SA_NS, "kube-controller-manager")
    obj["spec"]["holderIdentity"] = "hami"
    code, body = cluster.call("scheduler", "PUT", f"{LEASES}/kube-controller-manager", obj)
    assert code == 403, body
    code, body = cluster.call("scheduler", "GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/x")
    assert code == 403, body
    own = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "hami-scheduler", "namespace": SA_NS}, "spec": {"holderIdentity": "me"}}
    code, body = cluster.call("scheduler", "POST", LEASES, own)
    assert code == 201, body
    code, body = cluster.call("scheduler", "GET", f"{LEASES}/hami-scheduler")
    assert code == 200, body
    code, body = cluster.call("scheduler", "PUT", f"{LEASES}/hami-scheduler", body)
    assert code == 200, body
