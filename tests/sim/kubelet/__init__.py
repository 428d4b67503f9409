"""SIMULATED kubelet device manager (device plugin API v1beta1) for tests and the demo.

This is not the kubelet. It reproduces, module by module, what a device plugin can observe of the real
one (kubernetes ``pkg/kubelet/cm/devicemanager``), so the plugin is tested against the kubelet's harsh
behaviour rather than a kind approximation of it:

==================  ==========================================================================================
``registration``    ``kubelet.sock`` Registration server; dial-back (10 s), GetDevicePluginOptions and
                    ListAndWatch with no deadline; clients kept by resource name (the re-registration race)
``endpoint``        one plugin's RPCs (no deadline), stop time and grace period
``devicemanager``   device health, GetPreferredAllocation / Allocate decisions and checks, capacity
``pod_devices``     which container holds which devices, with its cached Allocate answer
``checkpoint``      ``kubelet_internal_checkpoint``: the real JSON shape and checksum
``kubelet``         ``SimulatedKubelet``: restarts, serial pod admission, queries for tests
``klog``            the kubelet's klog lines (the doctor parses them) and Go error spellings
==================  ==========================================================================================

Library use: ``SimulatedKubelet(root).start()``, ``submit(pod)``/``admit(pod, timeout)``, ``restart()``.
Process use: ``python -m tests.sim.kubelet --root DIR [-v 4] [--pods pods.json]``
(``--kubeconfig K --node-name N`` also admits pods bound to N on that API server).
Every known difference from the real kubelet is listed in docs/testing.md.
"""

from tests.sim.kubelet.checkpoint import CHECKPOINT_FILE
from tests.sim.kubelet.klog import KlogWriter
from tests.sim.kubelet.kubelet import AdmissionResult, EndpointView, SimulatedKubelet
from tests.sim.kubelet.registration import KUBELET_SOCKET, SUPPORTED_VERSIONS, is_extended_resource_name

CHECKPOINT = CHECKPOINT_FILE

__all__ = [
    "CHECKPOINT",
    "KUBELET_SOCKET",
    "SUPPORTED_VERSIONS",
    "AdmissionResult",
    "EndpointView",
    "KlogWriter",
    "SimulatedKubelet",
    "is_extended_resource_name",
]
