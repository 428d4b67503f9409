"""community.general-style helpers to run a module's main() in-process (patch_module_args + exit capture)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class AnsibleExitJson(Exception):
    def __init__(self, result: dict):
        super().__init__("exit_json")
        self.result = result


class AnsibleFailJson(Exception):
    def __init__(self, result: dict):
        super().__init__(result.get("msg"))
        self.result = result


def _exit_json(self: Any, **kwargs: Any) -> None:
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(json.loads(json.dumps(kwargs, default=str)))


def _fail_json(self: Any, msg: str, **kwargs: Any) -> None:
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise AnsibleFailJson(json.loads(json.dumps(kwargs, default=str)))


def run_module(
    main: Any, args: dict, monkeypatch: pytest.MonkeyPatch, check_mode: bool = False, diff: bool = False
) -> dict:
    """Run main() with args; return the result dict (failed=True for fail_json)."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)
    full = dict(args)
    if check_mode:
        full["_ansible_check_mode"] = True
    if diff:
        full["_ansible_diff"] = True
    with patch_module_args(full):
        try:
            main()
        except AnsibleExitJson as exc:
            return exc.result
        except AnsibleFailJson as exc:
            return exc.result
    raise AssertionError("module returned without exit_json/fail_json")
