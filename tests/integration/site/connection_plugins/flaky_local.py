"""A TEST-ONLY connection: ``local``, except that the host goes down (unreachable, as ssh reports a node
that went away) in the plays whose name contains ``hami_test_down_play``. site.yml's tests use it to make a
node drop out in the middle of a run, in a chosen play, deterministically."""

from __future__ import annotations

DOCUMENTATION = r"""
    name: flaky_local
    short_description: local, but unreachable inside chosen plays (tests only)
    description:
      - Runs tasks on the controller like C(local). Raises a connection failure when the current play's
        name contains O(down_play).
    author: hami.node developers
    options:
      down_play:
        description: A part of the names of the plays in which the host is unreachable; empty for never.
        default: ''
        vars:
          - name: hami_test_down_play
      play:
        description: The current play's name.
        default: ''
        vars:
          - name: ansible_play_name
"""

from ansible.errors import AnsibleConnectionFailure  # noqa: E402
from ansible.plugins.connection.local import Connection as Local  # noqa: E402


class Connection(Local):
    transport = "flaky_local"

    def exec_command(self, cmd, in_data=None, sudoable=True):
        down = self.get_option("down_play")
        if down and down in (self.get_option("play") or ""):
            raise AnsibleConnectionFailure("host went down during play %r (hami_test_down_play)"
                                           % self.get_option("play"))
        return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
