"""hami.node.linear_fleet runs a play as Ansible's linear strategy does, without spinning while it waits.

Real ansible-playbook over local-connection hosts. The spin is counted, not timed: a callback loaded into
the main process counts how often it asks a worker whether it is alive. With more hosts than forks the
builtin strategy asks thousands of times while a worker sleeps (a 0.1 ms loop); ours asks once per worker
that ends, plus once a second at most.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.plugins.ansible_runner import VENV_BIN, ansible_env

HOSTS = 4
SLEEP_S = 0.4

COUNTING_CALLBACK = '''
from __future__ import annotations
import json, os
from ansible.executor.process.worker import WorkerProcess
from ansible.plugins.callback import CallbackBase

CALLS = {"is_alive": 0}
_orig = WorkerProcess.is_alive

def _counted(self):
    CALLS["is_alive"] += 1
    return _orig(self)

WorkerProcess.is_alive = _counted

class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "count_is_alive"

    def v2_playbook_on_stats(self, stats):
        hosts = {h: stats.summarize(h) for h in sorted(stats.processed)}
        with open(os.environ["COUNT_OUT"], "w") as f:
            json.dump({"calls": CALLS["is_alive"], "hosts": hosts}, f)
'''

PLAYBOOK = f"""
- hosts: fleet
  gather_facts: false
  tasks:
    - name: every host's worker sleeps, one fork for {HOSTS} hosts
      ansible.builtin.command: sleep {SLEEP_S}
      changed_when: false
    - name: a host that fails is left behind, the others go on (linear's rule)
      ansible.builtin.fail:
        msg: sick
      when: inventory_hostname == 'h1'
    - name: the next task runs on the hosts that are left, after the previous one ended everywhere
      ansible.builtin.set_fact:
        order_ok: true
"""


def run(tmp_path: Path, strategy: str) -> tuple[subprocess.CompletedProcess, dict]:
    work = tmp_path / strategy.replace(".", "_")
    (work / "callbacks").mkdir(parents=True)
    (work / "callbacks" / "count_is_alive.py").write_text(COUNTING_CALLBACK)
    (work / "ansible.cfg").write_text("[defaults]\nforks = 1\n")
    inv = work / "inv.ini"
    inv.write_text(
        "[fleet]\n"
        + "".join(
            f"h{i} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
            for i in range(HOSTS)
        )
    )
    book = work / "play.yml"
    book.write_text(PLAYBOOK)
    env = ansible_env(work, stubs=False)
    env.update(
        {
            "ANSIBLE_CONFIG": str(work / "ansible.cfg"),
            "ANSIBLE_STRATEGY": strategy,
            "ANSIBLE_CALLBACK_PLUGINS": str(work / "callbacks"),
            "ANSIBLE_CALLBACKS_ENABLED": "count_is_alive",
            "COUNT_OUT": str(work / "count.json"),
        }
    )
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inv), str(book)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert (work / "count.json").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, json.loads((work / "count.json").read_text())


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strategy")
    return {s: run(tmp, s) for s in ("linear", "hami.node.linear_fleet")}


def test_the_play_ends_as_under_linear(both):
    for strategy, (proc, out) in both.items():
        assert proc.returncode == 2, (strategy, proc.stdout[-3000:])  # h1 failed
        hosts = out["hosts"]
        assert hosts["h1"]["failures"] == 1, strategy
        for h in ("h0", "h2", "h3"):
            assert hosts[h]["failures"] == 0 and hosts[h]["ok"] == 2, (strategy, hosts[h])
    assert both["linear"][1]["hosts"] == both["hami.node.linear_fleet"][1]["hosts"]


def test_waiting_for_a_free_fork_does_not_spin(both):
    builtin, ours = both["linear"][1]["calls"], both["hami.node.linear_fleet"][1]["calls"]
    # the control: the builtin loop asks every 0.1 ms while each of 3 queued hosts waits ~0.4 s
    assert builtin > 1000, builtin
    # ours: about one question per worker that ends and per queued task (+1 per second of waiting)
    assert ours < 100, ours
