"""DRA driver for the node's NVIDIA GPUs (``hami-agent dra``), shared the HAMi way: docs/dra.md.

Modules, one job each:
  settings   typed options, validated with messages that name the flag and the fix
  devices    NVML snapshot -> published devices (attributes, consumable capacity, MIG), taints
  publisher  this node's ResourceSlices: written on change, pool generations, re-created when deleted
  claims     ResourceClaims from the informer, one budgeted API read on a miss
  prepare    NodePrepareResources/NodeUnprepareResources: checks, HAMi-core edits, one commit
  cdi        CDI spec files of prepared claims
  checkpoint prepared claims on disk (atomic, checksummed)
  plugin     gRPC: DRAPlugin v1/v1beta1, DRAResourceHealth v1/v1alpha1, plugin-watcher registration
  driver     the loop: NVML supervisor -> devices + health -> publisher and plugin; MIG pause; GC
  metrics    Prometheus metrics
  cmd        the ``hami-agent dra`` subcommand
  api        generated gRPC stubs (our own copies of the kubelet's .proto files)
"""
