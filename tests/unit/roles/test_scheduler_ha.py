"""High availability from the hami_scheduler role's variables (no more hami_scheduler_extra_args): the
unit passes the Lease timings, the advertise URL followers forward to, and the forwarding TLS settings;
the flags parse with the agent's own parser and pass its timing check; the role's assert refuses timings
the agent would refuse and several hosts without mtls (followers could not forward)."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from hami_agent.scheduler.serve import cmd as scheduler_cmd
from tests.unit.roles.test_unit_templates import ROLES, execstart, render, render_env, role_vars

pytestmark = pytest.mark.unit


def scheduler_args(**overrides) -> argparse.Namespace:
    v = role_vars("hami_scheduler", **overrides)
    argv = execstart(render("hami_scheduler", "hami-scheduler.service.j2", v)).split()[2:]
    p = argparse.ArgumentParser()
    p.add_argument("-v", type=int)
    scheduler_cmd.add_arguments(p)
    return p.parse_args(argv)


def test_defaults_give_kube_schedulers_timings_and_a_verifiable_advertise_url():
    args = scheduler_args()
    assert args.leader_elect
    assert (args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
            args.leader_elect_retry_period) == (15.0, 10.0, 2.0)
    # the inventory hostname is a SAN of the role's serving certificate, so the follower's TLS verifies
    assert args.advertise_url == "https://control-1:9443"
    assert "DNS:{{ inventory_hostname }}" in (ROLES / "hami_scheduler" / "defaults" / "main.yml").read_text()
    assert args.forward_ca_file == "/etc/hami/pki/ca.crt"
    assert args.forward_cert_file == "" and args.forward_key_file == ""  # loopback: nothing to present


def test_mtls_followers_present_kube_schedulers_client_certificate():
    args = scheduler_args(hami_scheduler_extender_auth="mtls")
    # followers forward to the verbs' own listener (the webhook's does not serve them)
    assert args.advertise_url == "https://control-1:9444" and args.extender_bind_address == "0.0.0.0:9444"
    assert args.forward_cert_file == "/etc/kubernetes/hami-extender-client.crt"
    assert args.forward_key_file == "/etc/kubernetes/hami-extender-client.key"
    assert scheduler_cmd.build_serving(args)["auth"].mode == "mtls"


def test_variables_reach_the_flags():
    args = scheduler_args(hami_scheduler_leader_elect_lease_duration=30,
                          hami_scheduler_leader_elect_renew_deadline=20.5,
                          hami_scheduler_leader_elect_retry_period=4,
                          hami_scheduler_advertise_url="https://sched-a.example:9443",
                          hami_scheduler_forward_ca_file="/etc/pki/site-ca.crt")
    assert (args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
            args.leader_elect_retry_period) == (30.0, 20.5, 4.0)
    assert args.advertise_url == "https://sched-a.example:9443"
    assert args.forward_ca_file == "/etc/pki/site-ca.crt"


def test_without_tls_or_leader_election():
    args = scheduler_args(hami_scheduler_tls=False, hami_scheduler_bind_host="127.0.0.1")
    assert args.advertise_url == "http://control-1:9443" and args.forward_ca_file == ""
    cmd = execstart(render("hami_scheduler", "hami-scheduler.service.j2",
                           role_vars("hami_scheduler", hami_scheduler_leader_elect=False)))
    assert not re.search(r"--leader-elect|--advertise-url|--forward-", cmd)


def _assert_task() -> dict:
    tasks = yaml.safe_load((ROLES / "hami_scheduler" / "tasks" / "main.yml").read_text())
    return next(t for t in tasks if t["name"] == "Check the leader election and forwarding settings")


def role_assert_passes(hosts: int = 1, **overrides) -> bool:
    """The role's assert, evaluated as Ansible would (``match`` is Ansible's test: re.match)."""
    env = render_env()
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    v = {**role_vars("hami_scheduler", **overrides),
         "ansible_play_hosts_all": [f"h{i}" for i in range(hosts)]}
    conds = _assert_task()["ansible.builtin.assert"]["that"]
    return all(env.compile_expression(c)(**v) for c in conds)


def test_role_assert_accepts_the_defaults_and_refuses_what_the_agent_would():
    assert role_assert_passes()
    assert role_assert_passes(hosts=2, hami_scheduler_extender_auth="mtls")
    assert not role_assert_passes(hami_scheduler_leader_elect_renew_deadline=15)  # not below the lease
    assert not role_assert_passes(hami_scheduler_leader_elect_retry_period=9)  # 1.2 x 9 > renew deadline
    assert not role_assert_passes(hami_scheduler_advertise_url="control-1:9443")
    assert not role_assert_passes(hami_scheduler_forward_cert_file="/x.crt")  # a certificate without key
    # several hosts: loopback and token followers cannot forward to the leader
    assert not role_assert_passes(hosts=2)
    assert not role_assert_passes(hosts=2, hami_scheduler_extender_auth="token")


@pytest.mark.parametrize(("lease", "renew", "retry"), [
    (15, 10, 2), (10, 10, 2), (15, 12, 10), (15, 2.4, 2), (15, 2.5, 2), (60, 40, 30), (8, 6, 1)])
def test_role_timings_agree_with_the_agents_check(lease, renew, retry):
    """The role refuses exactly what `hami-agent scheduler` refuses at start (cmd.py: lease > renew >
    JITTER x retry), so a bad value fails the play, naming the variables, not a crash-looping unit."""
    from hami_agent.k8s.leader import JITTER

    agent_accepts = lease > renew > retry * JITTER
    assert role_assert_passes(hami_scheduler_leader_elect_lease_duration=lease,
                              hami_scheduler_leader_elect_renew_deadline=renew,
                              hami_scheduler_leader_elect_retry_period=retry) == agent_accepts


def test_argument_specs_document_every_ha_variable():
    spec = yaml.safe_load((ROLES / "hami_scheduler" / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLES / "hami_scheduler" / "defaults" / "main.yml").read_text())
    for var in ("hami_scheduler_leader_elect_lease_duration", "hami_scheduler_leader_elect_renew_deadline",
                "hami_scheduler_leader_elect_retry_period", "hami_scheduler_advertise_url",
                "hami_scheduler_forward_ca_file", "hami_scheduler_forward_cert_file",
                "hami_scheduler_forward_key_file"):
        assert var in defaults and options[var]["description"], var
    assert [options[f"hami_scheduler_leader_elect_{k}"]["default"]
            for k in ("lease_duration", "renew_deadline", "retry_period")] == [15, 10, 2]


def test_followers_forward_to_the_plays_scheduler_hosts_only_over_https():
    """Issue 27 item 4: --forward-peers lists every scheduler host's advertise URL (a per-host override from
    the inventory wins); a clear-text URL is never passed (the agent would refuse it anyway)."""
    args = scheduler_args(ansible_play_hosts_all=["control-1", "control-2", "control-3"],
                          hostvars={"control-1": {}, "control-2": {},
                                    "control-3": {"hami_scheduler_advertise_url": "https://sched-3.example:443"}})
    assert args.forward_peers.split(",") == ["https://control-1:9443", "https://control-2:9443",
                                             "https://sched-3.example:443"]
    mtls = scheduler_args(hami_scheduler_extender_auth="mtls",
                          ansible_play_hosts_all=["control-1", "control-2"],
                          hostvars={"control-1": {}, "control-2": {}})
    assert mtls.forward_peers == "https://control-1:9444,https://control-2:9444"  # the verbs' listener
    assert scheduler_cmd._csv(args.forward_peers)
    plain = scheduler_args(hami_scheduler_tls=False, hami_scheduler_bind_host="127.0.0.1")
    assert plain.forward_peers == ""
