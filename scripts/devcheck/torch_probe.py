"""PyTorch on the real GPU, run as a CHILD of the device check (never imported by it).

    python3 torch_probe.py load SECONDS     # a matmul loop: prints one READY JSON line, then computes
    python3 torch_probe.py alloc MIB HOLD   # one allocation of MIB MiB (alloc_probe.cu's stand-in when
                                            # there is no nvcc); prints one JSON line, holds HOLD seconds

``load`` keeps the GPU busy so the monitor sees utilisation > 0 and NVML lists the process with its memory.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time


def load(seconds: float) -> int:
    import torch

    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev)
    b = torch.randn(8192, 8192, device=dev)
    c = a @ b
    torch.cuda.synchronize()
    ready = {"ready": True, "pid": os.getpid(), "device": torch.cuda.get_device_name(0),
             "reserved_bytes": torch.cuda.memory_reserved(), "torch": torch.__version__}
    print(json.dumps(ready), flush=True)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for _ in range(8):
            c = a @ b
        torch.cuda.synchronize()
        n += 8
    print(json.dumps({"done": True, "matmuls": n, "checksum": float(c[0, 0])}), flush=True)
    return 0


def alloc(mib: int, hold: float) -> int:
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context first
    try:
        x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        x.zero_()
        torch.cuda.synchronize()
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        oom = "out of memory" in str(exc).lower()
        err = "cudaErrorMemoryAllocation" if oom else str(exc)[:300]
        print(json.dumps({"mib": mib, "ok": False, "stage": "torch.empty", "error": err, "pid": os.getpid()}),
              flush=True)
        return 3
    print(json.dumps({"mib": mib, "ok": True, "stage": "torch.empty", "error": None, "pid": os.getpid()}),
          flush=True)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        r, _w, _x = select.select([sys.stdin], [], [], 0.2)
        if r and not sys.stdin.read(1):
            break
    del x
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "load":
        return load(float(argv[1]))
    if len(argv) >= 2 and argv[0] == "alloc":
        return alloc(int(argv[1]), float(argv[2]) if len(argv) > 2 else 0.0)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
