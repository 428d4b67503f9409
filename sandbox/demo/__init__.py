"""``python -m sandbox demo``: the whole story on the SIMULATED cluster, every step checked.

a) build what is missing and start the sandbox;
b) provision with the real playbooks (``playbooks/site.yml``);
c) submit a sample workload through the API server and show where each pod landed and what each container
   received from the device plugin's Allocate (the SIMULATED kubelet records it);
d) replay seed 003: known-bad driver + mixed MIG -> NVML hangs; pods keep being admitted; ``hami-agent
   doctor`` names NVML_INIT_HANG_KNOWN_BAD_DRIVER with evidence; ``remediate_nvml_hang.yml`` fixes it;
   doctor is clean;
e) roll a driver pin change over the GPU nodes under a PodDisruptionBudget (sandbox/rollout.py): a node
   an operator cordoned stays cordoned, a node that fails its gate stays cordoned and stops the roll, the
   fixed node resumes, MIG and MPS drift on nodes with GPU pods evict them first, a second run changes
   nothing;
f) report (text, demo-output/report.html and report.json). Exit 0 only if every check passed.
"""

from sandbox.demo.run import run_demo

__all__ = ["run_demo"]
