"""gpusim returns NVML's documented codes (nvml.h doc comments) in the documented conditions, for the calls
the agent, the role's NVML probe and the modules' tools make. The table is in docs/gpusim.md."""

from __future__ import annotations

import pytest

from tests.gpusim.fixtures import GpusimNode
from tests.integration.gpusim.test_library import SEED_GPUS, result

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LOSE_GPU = """
        def lose(index):  # the GPU falls off the bus while this process holds its handle
            path = os.environ["GPUSIM_STATE"]
            doc = json.load(open(path))
            doc["gpus"][index]["lost"] = True
            json.dump(doc, open(path + ".tmp", "w"))
            os.replace(path + ".tmp", path)
"""


def test_system_queries_that_need_no_init(gpusim_node: GpusimNode) -> None:
    data = result(
        gpusim_node,
        """
        n._LoadNvmlLibrary()
        out([n.nvmlSystemGetNVMLVersion(), n.nvmlSystemGetCudaDriverVersion_v2(),
             err(n.nvmlSystemGetDriverVersion)])
    """,
    )
    assert data == ["12.570.172.08", 12080, "NVMLError_Uninitialized"]
    gpusim_node.update(lambda s: s.update(cuda_driver_version=0))  # no libcuda.so.1 on the node
    missing = result(gpusim_node, "n.nvmlInit(); out(err(n.nvmlSystemGetCudaDriverVersion_v2))")
    assert missing == "NVMLError_LibraryNotFound"


def test_bad_index_uuid_and_buffers(gpusim_node: GpusimNode) -> None:
    gpusim_node.update(
        lambda s: s["gpus"][4].update(
            processes=[{"pid": 10, "used_memory_mib": 5}, {"pid": 11, "used_memory_mib": 6}]
        )
    )
    data = result(
        gpusim_node,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(4)
        small = ctypes.create_string_buffer(4)
        count = ctypes.c_uint(0)
        out([err(n.nvmlDeviceGetHandleByIndex, 8), err(n.nvmlDeviceGetHandleByUUID, "GPU-nope"),
             n.nvmlLib.nvmlSystemGetDriverVersion(small, ctypes.c_uint(4)),
             n.nvmlLib.nvmlDeviceGetUUID(h, small, ctypes.c_uint(4)),
             n.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), None), count.value,
             [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]])
    """,
    )
    # 7 = NVML_ERROR_INSUFFICIENT_SIZE; the process count is filled in for the caller to retry with
    assert data == ["NVMLError_InvalidArgument", "NVMLError_NotFound", 7, 7, 7, 2, [10, 11]]


def test_mig_queries_on_gpus_without_mig(gpusim_node: GpusimNode) -> None:
    gpusim_node.update(lambda s: s["gpus"][5]["mig"].update(capable=False))
    data = result(
        gpusim_node,
        """
        n.nvmlInit()
        full, plain = n.nvmlDeviceGetHandleByIndex(3), n.nvmlDeviceGetHandleByIndex(5)
        out([err(n.nvmlDeviceGetMigMode, plain), err(n.nvmlDeviceGetMigDeviceHandleByIndex, plain, 0),
             err(n.nvmlDeviceGetGpuInstanceId, full), err(n.nvmlDeviceGetComputeInstanceId, full),
             n.nvmlDeviceGetMigMode(full)])
    """,
    )
    assert data == [
        "NVMLError_NotSupported",
        "NVMLError_NotSupported",
        "NVMLError_NotSupported",
        "NVMLError_NotSupported",
        [0, 0],
    ]


def test_a_gpu_lost_while_in_use(gpusim_node: GpusimNode) -> None:
    data = result(
        gpusim_node,
        LOSE_GPU
        + """
        n.nvmlInit()
        h, ok = n.nvmlDeviceGetHandleByIndex(6), n.nvmlDeviceGetHandleByIndex(7)
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
        before = err(n.nvmlEventSetWait_v2, es, 50)
        lose(6)
        out([before, err(n.nvmlDeviceGetUUID, h), err(n.nvmlDeviceGetMemoryInfo, h),
             err(n.nvmlDeviceGetHandleByIndex, 6), err(n.nvmlEventSetWait_v2, es, 5000),
             err(n.nvmlDeviceGetHandleByUUID, n.nvmlDeviceGetUUID(ok)), n.nvmlDeviceGetUUID(ok)])
    """,
    )
    assert data == [
        "NVMLError_Timeout",
        "NVMLError_GpuIsLost",
        "NVMLError_GpuIsLost",
        "NVMLError_GpuIsLost",
        "NVMLError_GpuIsLost",
        "NVMLError_GpuIsLost",
        SEED_GPUS[7],
    ]
