"""Label values the agent writes, kept valid for the Kubernetes API.

A label value has at most 63 characters from ``[-A-Za-z0-9_.]``, starting and ending alphanumeric
(``IsValidLabelValue`` in kubernetes/apimachinery ``pkg/util/validation/validation.go``). A node name is a
DNS subdomain of up to 253 characters, so ``hami.io/vgpu-node=<node>`` cannot always be a label. HAMi writes
it anyway (Project-HAMi/HAMi ``pkg/util/util.go`` ``PatchPodAnnotations`` adds the label to the same merge
patch as the annotations), so on such a node the API server refuses the whole patch with 422 and the pod
never schedules. docs/protocol.md ("The hami.io/vgpu-node label") explains the choice made here.
"""

from __future__ import annotations

import hashlib
import re

LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_HASH_CHARS = 10  # 40 bits of sha256: names sharing a 52-character prefix still get distinct values


def is_label_value(value: str) -> bool:
    """True when the API server accepts ``value`` as a label value."""
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value) is not None


def vgpu_node_label(node: str) -> str:
    """The ``hami.io/vgpu-node`` pod label value for ``node``: the node name itself whenever it is a
    valid label value (every node name up to 63 characters is), as HAMi writes it; otherwise the name's
    first characters, ``-`` and a hash of the whole name, 63 characters at most. The annotation of the
    same key always carries the full name; readers that need the node read the annotation."""
    if is_label_value(node):
        return node
    digest = hashlib.sha256(node.encode()).hexdigest()[:_HASH_CHARS]
    keep = LABEL_VALUE_MAX - 1 - _HASH_CHARS
    # node names are DNS subdomains (valid label characters); the substitutions only keep any input valid
    prefix = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", re.sub(r"[^-A-Za-z0-9_.]", "-", node[:keep]))
    return f"{prefix}-{digest}" if prefix else digest
