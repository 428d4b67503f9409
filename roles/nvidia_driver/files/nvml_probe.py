# NVML probe run by the nvidia_driver role as `python3 -c <this file>` under `timeout`: no file is left on
# the node. It calls what every NVML client calls first (nvmlInit_v2, nvmlSystemGetDriverVersion,
# nvmlDeviceGetCount_v2, nvmlShutdown) through ctypes, stdlib only, and prints one JSON line.
# Exit 0 ok, 1 NVML error ("nvml Init err: ..."), 2 library not found. A hang is the caller's timeout.
import ctypes
import json
import sys

try:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as exc:
    print(json.dumps({"ok": False, "error": "libnvidia-ml.so.1 not found: %s" % exc}))
    sys.exit(2)


def err(rc):
    try:
        fn = lib.nvmlErrorString
        fn.restype = ctypes.c_char_p
        return "%s (%d)" % (fn(rc).decode(), rc)
    except Exception:  # noqa: BLE001 - older/simulated libs may lack it
        return "NVML error %d" % rc


rc = lib.nvmlInit_v2()
if rc != 0:
    print(json.dumps({"ok": False, "error": "nvml Init err: " + err(rc)}))
    sys.exit(1)
buf = ctypes.create_string_buffer(96)
rc = lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96))
version = buf.value.decode() if rc == 0 else None
count = ctypes.c_uint(0)
rc2 = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
lib.nvmlShutdown()
if rc != 0 or rc2 != 0:
    print(json.dumps({"ok": False, "error": "nvml query err: " + err(rc or rc2)}))
    sys.exit(1)
print(json.dumps({"ok": True, "driver_version": version, "device_count": count.value}))
