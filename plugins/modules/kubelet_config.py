#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors

from __future__ import annotations

DOCUMENTATION = r"""
module: kubelet_config
short_description: Merge settings into a KubeletConfiguration file or drop-in; handle overriding kubelet flags
version_added: 0.1.0
author:
  - hami.node developers
description:
  - Merges O(settings) into the kubelet's C(--config) file, for example C(/etc/kubernetes/kubelet-config.yaml)
    (kubespray) or C(/var/lib/kubelet/config.yaml) (kubeadm). The merge follows the kubelet's drop-in
    rules. Mappings merge, and lists and scalars replace.
  - Only the lines that change are edited. Comments, key order and the rest of the file stay as they are.
    The edited text is parsed again and compared with the intended document. When a layout cannot be
    edited in place, the module writes the file with PyYAML and warns that the comments were dropped.
  - Checks that the file is a C(KubeletConfiguration) (C(apiVersion) C(kubelet.config.k8s.io/v1beta1)).
  - With O(dropin=true) the file is a drop-in under the kubelet's C(--config-dir) that the module owns
    entirely. It contains C(apiVersion), C(kind) and O(settings), written as JSON (valid YAML), and needs
    no YAML library.
  - "Kubelet command-line flags beat the config file. The module looks for such flags in O(flag_files):
    C(--v=N) in kubespray's C(KUBE_LOG_LEVEL) and C(KUBELET_ARGS), kubeadm's C(KUBELET_KUBEADM_ARGS) and
    C(KUBELET_EXTRA_ARGS). It also looks for the kebab-case flag of each top-level setting, for example
    C(--max-pods). Depending on O(flag_policy) it warns, or it rewrites the C(--v) flag to O(verbosity)."
  - Writes are atomic (temp file + rename), with optional O(backup). RV(restart_required) says whether the
    kubelet must be restarted.
requirements:
  - PyYAML (python3-yaml) on the target, unless O(dropin=true).
options:
  path:
    description: The KubeletConfiguration file (or drop-in file with O(dropin=true)).
    type: path
    required: true
  settings:
    description:
      - KubeletConfiguration fields to set, nested as in the file.
      - "For example C({maxPods: 64, logging: {verbosity: 4}})."
    type: dict
    default: {}
  verbosity:
    description:
      - Shortcut for C(settings.logging.verbosity). It is also the level written into C(--v) flags when
        O(flag_policy=manage).
      - Seed 003 raised kubelet verbosity to see C(Issuing a GetPreferredAllocation call) (V(4) or higher).
    type: int
  dropin:
    description: Treat O(path) as a drop-in owned by this module. Its content is replaced, not merged.
    type: bool
    default: false
  create:
    description:
      - Create O(path) (with C(apiVersion) and C(kind)) when it does not exist.
      - A drop-in is always created.
    type: bool
    default: false
  flag_files:
    description: Environment files holding kubelet flags to inspect.
    type: list
    elements: path
    default:
      - /etc/kubernetes/kubelet.env
      - /var/lib/kubelet/kubeadm-flags.env
      - /etc/default/kubelet
      - /etc/sysconfig/kubelet
  flag_policy:
    description:
      - V(warn) reports overriding flags in RV(flag_overrides) and as warnings.
      - V(manage) also rewrites C(--v=N) flags to O(verbosity). Other overriding flags are only reported.
        kubespray rewrites C(kubelet.env) on its next run, so set C(kube_log_level) in its inventory too.
      - V(ignore) skips the check.
    type: str
    choices: [warn, manage, ignore]
    default: warn
  backup:
    description: Keep a timestamped copy of every file that is changed.
    type: bool
    default: false
extends_documentation_fragment:
  - hami.node.attributes
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
    details: Computes the new content and changes nothing.
  diff_mode:
    support: full
    details: Text diff of the config file and of any flag file it would change.
notes:
  - The top-level key C(verbosity), as in seed 003's file, is not a KubeletConfiguration field. The
    kubelet ignores it. The module warns and points to C(logging.verbosity).
"""

EXAMPLES = r"""
- name: Debug-level kubelet logs on a kubespray node (file + the --v flag that overrides it)
  hami.node.kubelet_config:
    path: /etc/kubernetes/kubelet-config.yaml
    verbosity: 4
    flag_policy: manage
  register: kubelet_cfg

- name: Restart the kubelet when needed
  ansible.builtin.systemd_service:
    name: kubelet
    state: restarted
  when: kubelet_cfg.restart_required

- name: Own a drop-in under --config-dir
  hami.node.kubelet_config:
    path: /etc/kubernetes/kubelet.conf.d/50-hami.conf
    dropin: true
    settings:
      maxPods: 64
      featureGates:
        DevicePluginCDIDevices: true
"""

RETURN = r"""
restart_required:
  description: The config or a flag file changed. Restart the kubelet to apply it.
  returned: always
  type: bool
config:
  description: The merged KubeletConfiguration, as the kubelet will read it from O(path).
  returned: success
  type: dict
comments_preserved:
  description: The file was edited in place (false means a full re-dump, with comments lost).
  returned: success
  type: bool
flag_overrides:
  description: Kubelet flags found in O(flag_files) that override settings this task manages.
  returned: always
  type: list
  elements: dict
  contains:
    file: {description: Env file., type: str}
    line: {description: Line number., type: int}
    variable: {description: Variable holding the flags., type: str}
    flag: {description: The flag as found., type: str, sample: --v=2}
    value: {description: Its value., type: str}
    setting: {description: The config field it overrides., type: str, sample: logging.verbosity}
    managed: {description: Rewritten by this task (O(flag_policy=manage)), type: bool}
backup_file:
  description: Backup of O(path), when O(backup=true) and it changed.
  returned: changed and backup
  type: str
"""

import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.hami.node.plugins.module_utils import _common, _kubelet  # noqa: E402

try:  # noqa: E402
    import yaml

    HAS_YAML = True
except ImportError:
    HAS_YAML = False


def dropin_text(settings):
    doc = {"apiVersion": _kubelet.API_VERSIONS[0], "kind": _kubelet.KIND}
    doc.update(settings)
    return json.dumps(doc, indent=2) + "\n", doc


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            settings=dict(type="dict", default={}),
            verbosity=dict(type="int"),
            dropin=dict(type="bool", default=False),
            create=dict(type="bool", default=False),
            flag_files=dict(type="list", elements="path", default=list(_kubelet.DEFAULT_FLAG_FILES)),
            flag_policy=dict(type="str", choices=["warn", "manage", "ignore"], default="warn"),
            backup=dict(type="bool", default=False),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    settings = dict(p["settings"])
    if p["verbosity"] is not None:
        logging_cfg = dict(settings.get("logging") or {})
        logging_cfg["verbosity"] = p["verbosity"]
        settings["logging"] = logging_cfg
    if "verbosity" in settings:
        module.warn(
            "'verbosity' is not a KubeletConfiguration field (the kubelet ignores it); use logging.verbosity "
            "(option verbosity) or the --v flag"
        )
    for reserved in ("apiVersion", "kind"):
        if reserved in settings:
            module.fail_json(msg="settings must not contain %s; the module manages it" % reserved)

    result = {"changed": False, "restart_required": False, "flag_overrides": [], "comments_preserved": True}
    diffs = []
    before = _common.read_text(path)

    if p["dropin"]:
        after, doc = dropin_text(settings)
    else:
        if not HAS_YAML:
            module.fail_json(
                msg=missing_required_lib("PyYAML (python3-yaml)", reason="to edit %s" % path)
                + " Or use dropin=true, which writes JSON with the standard library."
            )
        if before is None:
            if not p["create"]:
                module.fail_json(
                    msg="%s does not exist; set create=true to create it, or point path at the "
                    "kubelet's --config file (see `ps -ef | grep kubelet`)" % path
                )
            base = "apiVersion: %s\nkind: %s\n" % (_kubelet.API_VERSIONS[0], _kubelet.KIND)
        else:
            base = before
        try:
            _kubelet.validate_header(yaml.safe_load(base), path)
            after, doc, lossless = _kubelet.edit_text(base, settings, yaml)
        except (_kubelet.EditError, yaml.YAMLError) as exc:
            module.fail_json(msg="cannot edit %s: %s" % (path, exc))
        if before is not None and after != before and not lossless:
            result["comments_preserved"] = False
            module.warn(
                "%s could not be edited in place; it was re-written by PyYAML and its comments are lost"
                % path
            )
        if before is not None and yaml.safe_load(before) == doc:
            after = before  # semantically unchanged: leave formatting alone
    result["config"] = doc

    if after != before:
        result["changed"] = True
        diffs.append({"before": before or "", "after": after, "before_header": path, "after_header": path})
        if not module.check_mode:
            backup = _common.atomic_write(module, path, after, backup=p["backup"])
            if backup:
                result["backup_file"] = backup

    # Flags that override the file.
    if p["flag_policy"] != "ignore":
        keys = [k for k in settings if not isinstance(settings[k], dict)]
        for flag_file in p["flag_files"]:
            text = _common.read_text(flag_file)
            if text is None:
                continue
            found = _kubelet.find_flags(text, flag_file, keys)
            relevant = [f for f in found if f["setting"] != "logging.verbosity" or "logging" in settings]
            new_text = text
            for f in relevant:
                f["managed"] = False
                wanted_v = _kubelet.get_path(doc, "logging.verbosity")
                if (
                    f["setting"] == "logging.verbosity"
                    and p["flag_policy"] == "manage"
                    and wanted_v is not None
                ):
                    f["managed"] = True
                    if str(f["value"]) != str(wanted_v):
                        new_text = _kubelet.set_verbosity_flag(new_text, wanted_v)
                elif f["setting"] == "logging.verbosity":
                    wanted = _kubelet.get_path(doc, "logging.verbosity")
                    if wanted is not None and str(wanted) != str(f["value"]):
                        module.warn(
                            "%s:%d %s sets %s, which overrides logging.verbosity=%s in %s: the kubelet "
                            "keeps logging at -v %s (use flag_policy=manage, or kube_log_level in kubespray)"
                            % (flag_file, f["line"], f["variable"], f["flag"], wanted, path, f["value"])
                        )
                else:
                    module.warn(
                        "%s:%d %s sets %s, which overrides %s in %s"
                        % (flag_file, f["line"], f["variable"], f["flag"], f["setting"], path)
                    )
            result["flag_overrides"].extend(relevant)
            if new_text != text:
                result["changed"] = True
                diffs.append(
                    {"before": text, "after": new_text, "before_header": flag_file, "after_header": flag_file}
                )
                if not module.check_mode:
                    _common.atomic_write(module, flag_file, new_text, backup=p["backup"])

    if os.path.exists(path) and not module.check_mode:
        file_args = module.load_file_common_arguments(p, path=path)
        result["changed"] = module.set_fs_attributes_if_different(file_args, result["changed"])
    result["restart_required"] = result["changed"]
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
