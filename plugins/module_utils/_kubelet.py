# SPDX-License-Identifier: Apache-2.0
# Copyright: hami.node contributors
"""KubeletConfiguration editing that keeps comments and key order, and kubelet flag-override detection.

PRIVATE to the hami.node collection.

Why a small line editor instead of ruamel.yaml: ruamel is rarely installed on nodes, and PyYAML alone
drops comments and reorders nothing but rewrites every line. Kubelet config files (kubespray, kubeadm)
are plain block-style YAML, so we edit the few lines that change and leave the rest byte-for-byte.
Every edit is verified by re-parsing with PyYAML and comparing with the intended merged document; on
any mismatch (an exotic layout) the caller falls back to a full re-dump and warns that comments were
lost. PyYAML is therefore required (python3-yaml).
"""

from __future__ import annotations

import json
import re

API_VERSIONS = ("kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1alpha1")
KIND = "KubeletConfiguration"

# (file, variables) where kubelet command-line flags live, by installer.
DEFAULT_FLAG_FILES = (
    "/etc/kubernetes/kubelet.env",  # kubespray: KUBE_LOG_LEVEL="--v=2", KUBELET_ARGS="..."
    "/var/lib/kubelet/kubeadm-flags.env",  # kubeadm: KUBELET_KUBEADM_ARGS="..."
    "/etc/default/kubelet",  # Debian/Ubuntu packages: KUBELET_EXTRA_ARGS
    "/etc/sysconfig/kubelet",  # EL packages: KUBELET_EXTRA_ARGS
)

_KEY_LINE = re.compile(
    r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+|\"[^\"]*\"|'[^']*'):(?P<sep>[ \t]*)(?P<rest>.*)$"
)


class EditError(Exception):
    pass


# ------------------------------------------------------------------------------------------ merging
def deep_merge(base, overlay):
    """kubelet drop-in semantics: mappings merge recursively, lists and scalars replace."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def leaves(settings, prefix=()):
    """[(path tuple, value)] for every non-mapping value (an empty mapping is a leaf too)."""
    out = []
    for key, value in settings.items():
        path = prefix + (str(key),)
        if isinstance(value, dict) and value:
            out.extend(leaves(value, path))
        else:
            out.append((path, value))
    return out


def validate_header(doc, path):
    if not isinstance(doc, dict):
        raise EditError("%s is not a YAML mapping" % path)
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if kind != KIND or api not in API_VERSIONS:
        raise EditError(
            "%s has apiVersion=%r kind=%r; expected kind %s with apiVersion one of %s. Point path at the "
            "kubelet's --config file (see `ps -ef | grep kubelet`) or a --config-dir drop-in."
            % (path, api, kind, KIND, ", ".join(API_VERSIONS))
        )


# ------------------------------------------------------------------------------------ scalar render
_PLAIN = re.compile(r"^[A-Za-z0-9_./:@+-][A-Za-z0-9_./:@+ -]*$")


def scalar_text(value, yaml_mod):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    # Plain only when YAML reads it back as the same string (not a number, bool, null, ...).
    if _PLAIN.match(text) and text == text.strip():
        try:
            if yaml_mod.safe_load(text) == text:
                return text
        except yaml_mod.YAMLError:
            pass
    return json.dumps(text)


def render_entry(key, value, indent, yaml_mod):
    """Lines for `key: value` at an indent, block style."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        lines = ["%s%s:" % (pad, key)]
        for k, v in value.items():
            lines.extend(render_entry(k, v, indent + 2, yaml_mod))
        return lines
    if isinstance(value, list) and value:
        lines = ["%s%s:" % (pad, key)]
        for item in value:
            if isinstance(item, (dict, list)):
                dumped = yaml_mod.safe_dump([item], default_flow_style=False, sort_keys=False).rstrip("\n")
                lines.extend(pad + line for line in dumped.splitlines())
            else:
                lines.append("%s- %s" % (pad, scalar_text(item, yaml_mod)))
        return lines
    if isinstance(value, dict):
        return ["%s%s: {}" % (pad, key)]
    if isinstance(value, list):
        return ["%s%s: []" % (pad, key)]
    return ["%s%s: %s" % (pad, key, scalar_text(value, yaml_mod))]


# ---------------------------------------------------------------------------------- the line editor
def _is_content(line):
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def _unquote(key):
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "\"'":
        return key[1:-1]
    return key


def _split_comment(rest):
    """('10 ', '# comment') split of an inline value, ignoring # inside quotes."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i], rest[i:]
    return rest, ""


def _block_end(lines, start, indent):
    """Index after the last line belonging to the entry at lines[start] (its nested block)."""
    end = start + 1
    last = start + 1
    while end < len(lines):
        line = lines[end]
        if _is_content(line):
            ind = _indent(line)
            if ind < indent or (ind == indent and not line.lstrip().startswith("- ") and line.strip() != "-"):
                break
            last = end + 1
        end += 1
    return last


def _find_key(lines, lo, hi, key):
    """(line index, indent) of `key:` among the direct children in lines[lo:hi], else (None, child indent)."""
    child_indent = None
    i = lo
    while i < hi:
        line = lines[i]
        if not _is_content(line):
            i += 1
            continue
        ind = _indent(line)
        if child_indent is None:
            child_indent = ind
        if ind == child_indent:
            m = _KEY_LINE.match(line)
            if m and _unquote(m.group("key")) == key:
                return i, ind
            # "- item" lines at this indent belong to the previous key's sequence (YAML allows it).
        i += 1
    return None, child_indent


def set_path(lines, path, value, merged_subtree, yaml_mod):
    """Set `path` to `value` in lines (list of str, modified in place).

    `merged_subtree(depth)` returns the merged document's value at path[:depth], used when an
    intermediate entry must be rewritten wholesale (e.g. `logging: {}` in flow style).
    """
    lo, hi, parent_indent = 0, len(lines), -2
    for depth, key in enumerate(path):
        idx, ind = _find_key(lines, lo, hi, key)
        last = depth == len(path) - 1
        if idx is None:
            indent = ind if ind is not None else parent_indent + 2
            new_value = value if last else merged_subtree(depth + 1)
            new_lines = render_entry(key, new_value, indent, yaml_mod)
            insert_at = hi
            # Keep trailing blank lines/comments of the parent block after our insertion.
            while insert_at > lo and not _is_content(lines[insert_at - 1]):
                insert_at -= 1
            lines[insert_at:insert_at] = new_lines
            return
        m = _KEY_LINE.match(lines[idx])
        rest = m.group("rest")
        inline, comment = _split_comment(rest)
        end = _block_end(lines, idx, ind)
        has_block = inline.strip() == "" and end > idx + 1
        if last:
            scalar = not isinstance(value, (dict, list)) or value in ({}, [])
            if scalar and not has_block and not inline.strip().startswith(("|", ">", "&", "!")):
                text = (
                    scalar_text(value, yaml_mod)
                    if not isinstance(value, (dict, list))
                    else ("{}" if isinstance(value, dict) else "[]")
                )
                gap = (inline[len(inline.rstrip()) :] or " ") if comment else ""
                lines[idx] = "%s%s:%s%s%s%s" % (
                    m.group("indent"),
                    m.group("key"),
                    m.group("sep") or " ",
                    text,
                    gap,
                    comment,
                )
            else:
                lines[idx:end] = render_entry(_unquote(m.group("key")), value, ind, yaml_mod)
            return
        if not has_block:
            # Intermediate entry is a scalar or a flow mapping: rewrite it from the merged document.
            lines[idx:end] = render_entry(_unquote(m.group("key")), merged_subtree(depth + 1), ind, yaml_mod)
            return
        lo, hi, parent_indent = idx + 1, end, ind


def edit_text(text, settings, yaml_mod):
    """Return (new_text, merged_doc, lossless). Raises EditError for invalid documents."""
    try:
        doc = yaml_mod.safe_load(text) if text.strip() else {}
    except yaml_mod.YAMLError as exc:
        raise EditError("cannot parse YAML: %s" % exc) from exc
    if doc is None:
        doc = {}
    merged = deep_merge(doc, settings)
    lines = text.splitlines()

    def subtree_at(path):
        def get(depth):
            node = merged
            for k in path[:depth]:
                node = node[k]
            return node

        return get

    try:
        for path, value in leaves(settings):
            set_path(lines, path, value, subtree_at(path), yaml_mod)
        new_text = "\n".join(lines) + "\n"
        if yaml_mod.safe_load(new_text) == merged:
            return new_text, merged, True
    except (EditError, yaml_mod.YAMLError, KeyError, TypeError):
        pass
    dumped = yaml_mod.safe_dump(merged, default_flow_style=False, sort_keys=False)
    return dumped, merged, False


# -------------------------------------------------------------------------------- flag detection
_VERBOSITY_FLAG = re.compile(r"""(?P<flag>(?<![^\s"'])--?v(?:=|\s+))(?P<value>\d+)""")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?(?P<var>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def camel_to_flag(key):
    """maxPods -> --max-pods (kubelet flag names are the kebab-case of the config field, mostly)."""
    return "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", key).lower()


def find_flags(text, file_name, settings_keys):
    """Flags in an env file that override config: [{file, line, variable, flag, value, setting}].

    `--v=N` (or `-v N`) maps to logging.verbosity; `--max-pods=110` to maxPods, and so on for
    top-level keys in `settings_keys`.
    """
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _ENV_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        var, value = m.group("var"), m.group("value")
        for fm in _VERBOSITY_FLAG.finditer(value):
            found.append(
                {
                    "file": file_name,
                    "line": n,
                    "variable": var,
                    "flag": fm.group("flag").strip().rstrip("=") + "=" + fm.group("value"),
                    "value": fm.group("value"),
                    "setting": "logging.verbosity",
                }
            )
        for key in settings_keys:
            flag = camel_to_flag(key)
            fm = re.search(r"(?<![^\s\"'])%s(?:=|\s+)(\S+?)[\"']?(?=\s|$)" % re.escape(flag), value)
            if fm:
                found.append(
                    {
                        "file": file_name,
                        "line": n,
                        "variable": var,
                        "flag": "%s=%s" % (flag, fm.group(1)),
                        "value": fm.group(1),
                        "setting": key,
                    }
                )
    return found


def set_verbosity_flag(text, verbosity):
    """Rewrite every --v=N / -v N in env-file text to the wanted level. Returns new text."""
    out = []
    for line in text.splitlines():
        if _ENV_LINE.match(line) and not line.lstrip().startswith("#"):
            out.append(_VERBOSITY_FLAG.sub(lambda m: m.group("flag") + str(verbosity), line))
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def get_path(doc, dotted):
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
