"""The wire helpers the scheduler uses, in one place: reason constants (reference §4.3, exact
spelling) and re-exports of ``hami_agent.protocol``'s encoders. ``model.Picked`` has the same fields
as ``protocol.ContainerDevice``, so the protocol encoder takes it as is."""

from __future__ import annotations

from hami_agent.protocol import decode_pod_devices, encode_pod_devices, gen_reason

# Reason constants (reference §4.3, exact spelling).
CardTypeMismatch = "CardTypeMismatch"
CardUuidMismatch = "CardUuidMismatch"
CardTimeSlicingExhausted = "CardTimeSlicingExhausted"
CardComputeUnitsExhausted = "CardComputeUnitsExhausted"
CardInsufficientMemory = "CardInsufficientMemory"
CardInsufficientCore = "CardInsufficientCore"
CardNotHealth = "CardNotHealth"
CardCordoned = "CardCordoned"
NumaNotFit = "NumaNotFit"
ExclusiveDeviceAllocateConflict = "ExclusiveDeviceAllocateConflict"
CardNotFoundCustomFilterRule = "CardNotFoundCustomFilterRule"
CardMigTopologyInfeasible = "CardMigTopologyInfeasible"
NodeInsufficientDevice = "NodeInsufficientDevice"
AllocatedCardsInsufficientRequest = "AllocatedCardsInsufficientRequest"
NodeUnfitPod = "NodeUnfitPod"
NodeFitPod = "NodeFitPod"
ResourceQuotaNotFit = "ResourceQuotaNotFit"
ModeNotFit = "ModeNotFit"


__all__ = ["decode_pod_devices", "encode_pod_devices", "gen_reason"]
