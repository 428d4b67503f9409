"""Kubernetes object names, checked before they are used (issue 27 item 5).

A request body names a pod, its namespace and nodes; the extender builds API paths, cache keys, log
lines and events from them. Every name that is not what the API server itself would accept is refused
with a message naming the field, before any of that happens: a lone UTF-16 surrogate in a pod name used
to reach ``urllib.parse.quote`` in the API path builder and end as a 500.

The rules are apimachinery's (``k8s.io/apimachinery/pkg/util/validation``): ``IsDNS1123Subdomain``
(pod and node names: lower-case alphanumerics, ``-`` and ``.``, starting and ending alphanumeric, at most
253 characters) and ``IsDNS1123Label`` (namespaces: no ``.``, at most 63). A UID is an opaque string the
API server generates (a UUID); it is only compared, but it reaches logs and events, so it is limited to
printable ASCII."""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
UID_MAX = 128

# apimachinery's dns1123LabelFmt; a subdomain's parts have no length limit of their own (only the 253 in all)
_PART = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_PART)
_SUBDOMAIN_RE = re.compile(rf"{_PART}(?:\.{_PART})*")
# many names at once (kube-scheduler's NodeNames): the allowed characters over all names joined by newlines
_SUBDOMAIN_CHARS_RE = re.compile(r"[-a-z0-9.\n]*")
# ... and what a subdomain's structure forbids, as substrings of "\n" + joined + "\n"
_SUBDOMAIN_BAD_PAIRS = ("\n\n", "\n-", "\n.", "-\n", ".\n", "..", ".-", "-.")
_UID_RE = re.compile(r"[!-~]+")


def _shown(value: str, limit: int = 80) -> str:
    """The value as an error message may quote it: ``repr`` (escapes surrogates and control bytes), cut."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def subdomain_error(value: object) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (a pod or node name), or None when it is one."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        return f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters (got {len(value)})"
    if _SUBDOMAIN_RE.fullmatch(value) is None:
        return (f"{_shown(value)} is not a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit")
    return None


def label_error(value: object) -> str | None:
    """Why ``value`` is not a DNS-1123 label (a namespace name), or None when it is one."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be no more than {DNS1123_LABEL_MAX} characters (got {len(value)})"
    if _LABEL_RE.fullmatch(value) is None:
        return (f"{_shown(value)} is not a DNS-1123 label: lower-case letters, digits and '-', starting and "
                "ending with a letter or digit")
    return None


def uid_error(value: object) -> str | None:
    """Why ``value`` cannot be a Kubernetes UID (printable ASCII, at most 128 characters), or None."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > UID_MAX:
        return f"must be no more than {UID_MAX} characters (got {len(value)})"
    if _UID_RE.fullmatch(value) is None:
        return f"{_shown(value)} is not a UID: printable ASCII without spaces"
    return None


def all_subdomains(values: list[str]) -> bool:
    """True when every element of a list of strings is a DNS-1123 subdomain (one regex pass in C; the
    caller has checked they are strings). Use ``subdomain_error`` on each to name the bad one."""
    if not values:
        return True
    if max(map(len, values)) > DNS1123_SUBDOMAIN_MAX:
        return False
    joined = "\n" + "\n".join(values) + "\n"
    if not joined.isascii() or joined.count("\n") != len(values) + 1:
        return False  # a newline inside a name would pass for a separator
    if _SUBDOMAIN_CHARS_RE.fullmatch(joined) is None:
        return False
    return not any(pair in joined for pair in _SUBDOMAIN_BAD_PAIRS)


__all__ = ["all_subdomains", "label_error", "subdomain_error", "uid_error"]
