"""The systemd units and the kube-scheduler configuration the roles write, rendered from the role
templates and defaults: every unit sets LimitNOFILE (issue 14 deliverable 1: the scheduler's unit had
none, and ~1,100 idle connections exhausted systemd's default soft limit of 1024), and each
``hami_scheduler_extender_auth`` mode gives the extender flags and kube-scheduler's extender settings
that match (loopback: verbs on 127.0.0.1 over http; mtls: https with tlsConfig certFile/keyFile/caFile)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

jinja2 = pytest.importorskip("jinja2")  # comes with ansible-core (dev extra, Python >= 3.11)

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"


def _to_bool(v):
    return v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1", "on")


def render_env() -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)  # ansible's template module trims blocks too
    env.filters["bool"] = _to_bool
    env.filters["dirname"] = os.path.dirname
    env.filters["b64encode"] = lambda s: s
    env.globals["lookup"] = lambda kind, *args: "/home/ansible" if "env" in kind else ""
    return env


def role_vars(*roles: str, **overrides) -> dict:
    """Role defaults (templated values resolved like Ansible does, lazily) plus ``overrides``."""
    env = render_env()
    raw: dict = {"ansible_managed": "managed by hami.node", "inventory_hostname": "control-1",
                 "ansible_play_hosts_all": ["control-1"], "hostvars": {"control-1": {}}}
    for role in roles:
        raw.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {})
    raw.update(overrides)
    for _ in range(5):  # defaults refer to other defaults
        done = True
        for k, v in raw.items():
            if isinstance(v, str) and "{{" in v:
                try:
                    raw[k] = env.from_string(v).render(**raw).strip()
                    done = done and "{{" not in raw[k]  # it named a default not resolved yet
                except jinja2.UndefinedError:
                    done = False
        if done:
            break
    return raw


def render(role: str, template: str, variables: dict) -> str:
    return render_env().from_string((ROLES / role / "templates" / template).read_text()).render(**variables)


UNIT_TEMPLATES = sorted(p for p in ROLES.glob("*/templates/*.j2")
                        if p.name.endswith(".service.j2") or "override.conf" in p.name)


def test_every_unit_the_roles_write_sets_limitnofile():
    assert len(UNIT_TEMPLATES) >= 5, UNIT_TEMPLATES
    for path in UNIT_TEMPLATES:
        text = path.read_text()
        m = re.search(r"^LimitNOFILE=(.+)$", text, re.M)
        assert m, f"{path.relative_to(ROOT)}: no LimitNOFILE="
        assert m.group(1).isdigit() or m.group(1).startswith("{{"), m.group(1)


def unit_settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", " ")):
            k, _, v = line.partition("=")
            out.setdefault(k, v)
    return out


def execstart(text: str) -> str:
    m = re.search(r"^ExecStart=(.*?)(?<!\\)\n(?! )", text, re.M | re.S)
    assert m
    return " ".join(m.group(1).replace("\\\n", " ").split())


@pytest.mark.parametrize("mode", ["loopback", "mtls", "token"])
def test_scheduler_unit_and_kube_scheduler_config_match_the_auth_mode(mode):
    v = role_vars("hami_scheduler", hami_scheduler_extender_auth=mode)
    unit = render("hami_scheduler", "hami-scheduler.service.j2", v)
    settings = unit_settings(unit)
    limit = int(settings["LimitNOFILE"])
    # two caps (the verbs' listener, the webhook's) + API pool, listeners, runtime
    assert limit >= 2 * int(v["hami_scheduler_max_connections"]) + 200
    assert settings["NoNewPrivileges"] == "yes"
    cmd = execstart(unit)
    assert f"--extender-auth {mode}" in cmd and "--max-connections 1024" in cmd
    cfg = yaml.safe_load(render("hami_scheduler", "kube-scheduler-config.yaml.j2", v))
    ext = cfg["profiles"][0]["extenders"][0]
    assert ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind"
    if mode == "loopback":
        assert "--extender-bind-address 127.0.0.1:9444" in cmd
        assert "--bind-address 0.0.0.0:9443" in cmd and "--cert-file" in cmd  # the webhook listener
        assert ext["urlPrefix"] == "http://127.0.0.1:9444" and ext["enableHTTPS"] is False
        assert "tlsConfig" not in ext
    else:  # the verbs keep a listener of their own, over TLS (issue 27 item 2)
        assert "--extender-bind-address 0.0.0.0:9444" in cmd and "--bind-address 0.0.0.0:9443" in cmd
        assert ext["urlPrefix"] == "https://127.0.0.1:9444" and ext["enableHTTPS"] is True
        assert ext["tlsConfig"]["caFile"] == "/etc/hami/pki/ca.crt"
    assert "--max-connections-per-peer 128" in cmd and "--max-requests-per-peer 16" in cmd
    assert "--allowed-sources" not in cmd
    if mode == "mtls":
        assert "--client-ca-file /etc/hami/pki/ca.crt" in cmd
        assert "--extender-allowed-cns kube-scheduler" in cmd
        assert ext["tlsConfig"]["certFile"] == "/etc/kubernetes/hami-extender-client.crt"
        assert ext["tlsConfig"]["keyFile"] == "/etc/kubernetes/hami-extender-client.key"
    else:
        assert "--client-ca-file" not in cmd
        assert "certFile" not in ext.get("tlsConfig", {})


def test_the_rendered_scheduler_flags_parse():
    """What the unit passes is what `hami-agent scheduler` accepts, and its listener/auth checks pass."""
    import argparse

    from hami_agent.scheduler.serve import cmd as scheduler_cmd

    for mode in ("loopback", "mtls"):
        v = role_vars("hami_scheduler", hami_scheduler_extender_auth=mode)
        argv = execstart(render("hami_scheduler", "hami-scheduler.service.j2", v)).split()[2:]
        p = argparse.ArgumentParser()
        p.add_argument("-v", type=int)
        scheduler_cmd.add_arguments(p)
        args = p.parse_args(argv)
        serving = scheduler_cmd.build_serving(args)
        assert serving["auth"].mode == mode
        if mode == "loopback":
            assert serving["extender_bind"] == ("127.0.0.1", 9444)
        else:
            assert serving["extender_bind"] == ("0.0.0.0", 9444)
            assert serving["auth"].allowed_cns == ("kube-scheduler",)
        assert (serving["peers"].max_connections, serving["peers"].max_inflight) == (128, 16)
        assert serving["public_process"] is True  # the webhook's listeners in a process of their own
        assert serving["public_nice"] == 10
    v = role_vars("hami_scheduler", hami_scheduler_allowed_sources=["10.0.0.0/24", "192.168.1.10"])
    argv = execstart(render("hami_scheduler", "hami-scheduler.service.j2", v)).split()[2:]
    args = p.parse_args(argv)
    assert [str(n) for n in scheduler_cmd.build_serving(args)["peers"].allowed_sources] == [
        "10.0.0.0/24", "192.168.1.10/32"]


def test_agent_units_render_with_limits():
    v = role_vars("hami_agent", hami_agent_node_name="gpu-1")
    for template in ("hami-device-plugin.service.j2", "hami-monitor.service.j2"):
        settings = unit_settings(render("hami_agent", template, v))
        assert int(settings["LimitNOFILE"]) >= 1024, template
        assert settings["NoNewPrivileges"] == "yes", template


def test_loopback_bind_host_keeps_one_listener():
    """The sandbox's setting (bind 127.0.0.1, no TLS): the verbs stay on the one, already loopback,
    listener, and kube-scheduler (the simulated one too) calls it there."""
    v = role_vars("hami_scheduler", hami_scheduler_bind_host="127.0.0.1", hami_scheduler_port=18080,
                  hami_scheduler_tls=False)
    cmd = execstart(render("hami_scheduler", "hami-scheduler.service.j2", v))
    assert "--bind-address 127.0.0.1:18080" in cmd and "--extender-bind-address" not in cmd
    assert "--public-listener-process" not in cmd  # one listener: nothing to separate
    assert "--extender-auth loopback" in cmd and "--cert-file" not in cmd
    cfg = yaml.safe_load(render("hami_scheduler", "kube-scheduler-config.yaml.j2", v))
    ext = cfg["profiles"][0]["extenders"][0]
    assert ext["urlPrefix"] == "http://127.0.0.1:18080" and ext["enableHTTPS"] is False


AGENT_UNITS = ("hami-device-plugin.service.j2", "hami-dra.service.j2", "hami-monitor.service.j2")


def test_agent_units_name_the_module_version_file_only_when_it_is_not_sysfs():
    """A failing NVML is retried when the loaded module changes (agent/hami_agent/nvml/loaded.py): a
    simulated node's version file lives in gpusim's emulated sysfs; a real node's is the default."""
    for template in AGENT_UNITS:
        plain = render("hami_agent", template, role_vars("hami_agent"))
        assert "ExecStart=" in plain and "HAMI_DRIVER_VERSION_FILE" not in plain, template
        sim = render("hami_agent", template, role_vars(
            "hami_agent", nvidia_driver_module_version_file="/run/gpusim/sys/module/nvidia/version"))
        assert "Environment=HAMI_DRIVER_VERSION_FILE=/run/gpusim/sys/module/nvidia/version\n" in sim, template
