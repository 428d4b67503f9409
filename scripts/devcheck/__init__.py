"""The pieces of ``scripts/device_check.py``: the prepared check of the agent on a real NVIDIA GPU.

``core``: records, the global deadline, the processes it starts (all killed at the end), the report.
``checks_nvml``, ``checks_node``, ``checks_workload``: the checks themselves (docs/hardware.md).
``nvml_dump`` and ``torch_probe`` run as child processes; ``alloc_probe.cu`` is compiled with nvcc.
"""
