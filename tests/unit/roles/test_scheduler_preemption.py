"""Issue 29 item 3: the ``--preemption`` flag and the role's ``hami_scheduler_preemption``. The default is
``off`` (HAMi never evicts for GPUs); ``extender`` (/filter preempts, /preempt refines kube-scheduler's own)
is accepted by the agent and the role, and kube-scheduler's configuration then names ``preemptVerb``; the
agent refuses ``kube-scheduler`` (v1.38's preemption with filter extenders is not read yet), and so does
the role's check."""

from __future__ import annotations

import argparse

import pytest
import yaml

from hami_agent.scheduler.serve import cmd as scheduler_cmd
from tests.unit.roles.test_unit_templates import ROLES, render, render_env, role_vars

pytestmark = pytest.mark.unit


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    scheduler_cmd.add_arguments(p)
    return p


def _extender(v: dict) -> dict:
    cfg = yaml.safe_load(render("hami_scheduler", "kube-scheduler-config.yaml.j2", v))
    return cfg["profiles"][0]["extenders"][0]


def test_the_flag_defaults_to_off_and_refuses_what_is_not_built():
    p = _parser()
    assert scheduler_cmd.build_config(p.parse_args([])).preemption == "off"
    assert scheduler_cmd.build_config(p.parse_args(["--preemption", "off"])).preemption == "off"
    assert scheduler_cmd.build_config(p.parse_args(["--preemption", "extender"])).preemption == "extender"
    with pytest.raises(ValueError, match=r"--preemption kube-scheduler: not implemented.*135486"):
        scheduler_cmd.build_config(p.parse_args(["--preemption", "kube-scheduler"]))
    with pytest.raises(SystemExit):  # argparse names the choices
        p.parse_args(["--preemption", "on"])


def test_a_refused_mode_fails_the_start_as_bad_flags(caplog):
    p = _parser()
    p.add_argument("--kubeconfig", default="")
    args = p.parse_args(["--preemption", "kube-scheduler"])
    assert scheduler_cmd.run(args) == 2
    assert "bad flags: --preemption kube-scheduler: not implemented" in caplog.text


def test_role_default_is_the_string_off_and_the_unit_passes_it():
    defaults = yaml.safe_load((ROLES / "hami_scheduler" / "defaults" / "main.yml").read_text())
    assert defaults["hami_scheduler_preemption"] == "off"  # quoted: a bare off is YAML's False
    spec = yaml.safe_load((ROLES / "hami_scheduler" / "meta" / "argument_specs.yml").read_text())
    opt = spec["argument_specs"]["main"]["options"]["hami_scheduler_preemption"]
    assert opt["default"] == "off" and opt["choices"] == ["off", "extender"]
    v = role_vars("hami_scheduler")
    unit = render("hami_scheduler", "hami-scheduler.service.j2", v)
    assert "--preemption off \\" in unit
    ext = _extender(v)
    assert "preemptVerb" not in ext  # HAMi's chart configures none


def test_kube_scheduler_config_names_the_preempt_verb_when_preemption_is_on():
    v = role_vars("hami_scheduler", hami_scheduler_preemption="extender")
    ext = _extender(v)
    assert ext["preemptVerb"] == "preempt" and ext["filterVerb"] == "filter"


def _first_assert_passes(**overrides) -> bool:
    tasks = yaml.safe_load((ROLES / "hami_scheduler" / "tasks" / "main.yml").read_text())
    conds = next(t for t in tasks if "ansible.builtin.assert" in t)["ansible.builtin.assert"]["that"]
    env = render_env()
    v = {**role_vars("hami_scheduler", hami_scheduler_kubeconfig_content="x", **overrides)}
    return all(env.compile_expression(c)(**v) for c in conds)


def test_role_check_accepts_off_and_extender_only():
    assert _first_assert_passes()
    assert _first_assert_passes(hami_scheduler_preemption="extender")
    assert not _first_assert_passes(hami_scheduler_preemption="kube-scheduler")  # the agent refuses it
    assert not _first_assert_passes(hami_scheduler_preemption=False)  # an unquoted off


def test_the_rendered_extender_mode_parses():
    import argparse as ap

    from tests.unit.roles.test_unit_templates import execstart

    v = role_vars("hami_scheduler", hami_scheduler_preemption="extender")
    argv = execstart(render("hami_scheduler", "hami-scheduler.service.j2", v)).split()[2:]
    p = ap.ArgumentParser()
    p.add_argument("-v", type=int)
    p.add_argument("--config")
    scheduler_cmd.add_arguments(p)
    assert scheduler_cmd.build_config(p.parse_args(argv)).preemption == "extender"
