"""``hami.io/node-nvidia-score`` (Project-HAMi/HAMi ``pkg/device/nvidia/calculate_score.go``): GPU pair scores
for the topology-aware policy,
``[{"uuid":"GPU-a","score":{"GPU-b":<int>,...}},...]``, plus the link score table."""

from __future__ import annotations

import json
from collections.abc import Mapping

from hami_agent.protocol.devices import go_json
from hami_agent.protocol.errors import ProtocolError, quote

LINK_SCORES = {"CrossCPU": 10, "SameCPU": 20, "HostBridge": 30, "MultiSwitch": 40, "SingleSwitch": 50,
               "SameBoard": 60}
NVLINK_SCORE = 100  # per NVLink link, k = 1..18


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """``{uuid: {other: score}}`` → the annotation value (list order = mapping order)."""
    return go_json([{"uuid": u, "score": dict(others)} for u, others in scores.items()])


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(value)
    except (ValueError, RecursionError, TypeError) as exc:
        raise ProtocolError(f"node score: invalid JSON ({exc}) in {quote(value)}") from None
    if data is None:
        return {}
    if not isinstance(data, list):
        raise ProtocolError(f"node score: expected a JSON list, got {quote(data)}")
    out: dict[str, dict[str, int]] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("uuid"), str):
            raise ProtocolError(f"node score[{i}]: expected {{uuid, score}}, got {quote(item)}")
        score = item.get("score") or {}
        if not isinstance(score, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in score.items()):
            raise ProtocolError(f"node score[{i}]: 'score' must map UUIDs to integers, got {quote(score)}")
        out[item["uuid"]] = dict(score)
    return out
