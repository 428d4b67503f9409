"""Errors of the allocation path; their messages are what the kubelet puts in the pod's event."""

from __future__ import annotations


class AllocationError(RuntimeError):
    """Allocate/GetPreferredAllocation cannot be answered; the message is what the kubelet shows."""


class Refused(AllocationError):
    """Allocate refused before it could tell which pod the kubelet is admitting. Nothing is written:
    a refusal must not touch a pod that may not be the one being admitted."""
