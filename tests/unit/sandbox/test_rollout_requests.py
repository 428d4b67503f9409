"""sandbox/rollout.py reads the API request log: a cordon is a node write that sets spec.unschedulable,
whether the body is a merge patch or a JSON patch (the agents' lock writes are JSON patches: lists)."""

from sandbox.rollout import cordons


def test_cordons_reads_merge_and_json_patches_and_ignores_other_writes():
    reqs = [
        {"method": "PATCH", "path": "/api/v1/nodes/a", "body": {"spec": {"unschedulable": True}}},
        {"method": "PATCH", "path": "/api/v1/nodes/b", "body": [
            {"op": "test", "path": "/metadata/annotations/hami.io~1mutex.lock", "value": "x"},
            {"op": "remove", "path": "/metadata/annotations/hami.io~1mutex.lock"}]},
        {"method": "PATCH", "path": "/api/v1/nodes/c", "body": [
            {"op": "replace", "path": "/spec/unschedulable", "value": True}]},
        {"method": "PATCH", "path": "/api/v1/nodes/d", "body": {"spec": {"unschedulable": None}}},
        {"method": "PATCH", "path": "/api/v1/nodes/e/status", "body": {"spec": {"unschedulable": True}}},
        {"method": "PUT", "path": "/api/v1/nodes/f", "body": None},
    ]
    assert cordons(reqs) == ["a", "c"]
