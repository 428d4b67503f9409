"""Regenerate the committed gRPC stubs from ``api.proto`` and ``pluginregistration.proto``.

Run: ``.venv/bin/python -m hami_agent.deviceplugin.api.generate`` (needs grpcio-tools, a dev extra).

Post-processing, and why:
- the protoc runtime-version guard (``runtime_version.ValidateProtobufRuntimeVersion``) is removed:
  it would refuse every protobuf runtime older than the generator (we support protobuf >= 4.25, whose
  ``google.protobuf`` has no ``runtime_version`` module at all);
- the grpc version guard in ``*_pb2_grpc.py`` is removed for the same reason (grpcio >= 1.60);
- ``import api_pb2`` becomes ``from . import api_pb2`` so the stubs work from the installed package;
- the generator's version stamp line is dropped so regenerating with another grpcio-tools does not
  produce a spurious diff.
The protos are compiled with ``-I <agent dir>`` so the descriptor pool registers them under a unique
file name (``hami_agent/deviceplugin/api/api.proto``), never clashing with another ``api.proto``.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT_ROOT = HERE.parents[2]  # .../agent
PROTOS = ("api.proto", "pluginregistration.proto")
PACKAGE = "hami_agent.deviceplugin.api"

_RUNTIME_IMPORT = re.compile(r"^from google\.protobuf import runtime_version as _runtime_version\n", re.M)
_RUNTIME_CHECK = re.compile(r"^_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:.*\n)*?\)\n", re.M)
_VERSION_STAMP = re.compile(r"^# Protobuf Python Version: .*\n", re.M)
_GRPC_GUARD = re.compile(r"^GRPC_GENERATED_VERSION = .*?\n(?:.*\n)*?    \)\n", re.M)


def _postprocess_pb2(text: str) -> str:
    text = _RUNTIME_IMPORT.sub("", text)
    text = _RUNTIME_CHECK.sub("", text)
    return _VERSION_STAMP.sub("", text)


def _postprocess_grpc(text: str, stem: str, package: str = PACKAGE) -> str:
    text = text.replace(f"from {package} import {stem}_pb2 as", f"from . import {stem}_pb2 as")
    text = _GRPC_GUARD.sub("", text)
    # the guard is gone, so these imports are unused
    text = text.replace("import warnings\n", "")
    return text


def compile_protos(package: str, protos: Sequence[str], out_dir: Path) -> list[Path]:
    """Compile ``protos`` (files in ``package``'s directory) into ``out_dir`` with the post-processing
    above; return the written files. The DRA stubs (``hami_agent.dra.api.generate``) use it too."""
    from grpc_tools import protoc  # dev dependency, imported only here

    try:
        from importlib.resources import files

        include = str(files("grpc_tools") / "_proto")
    except Exception:  # pragma: no cover - very old grpc_tools
        include = ""
    pkg_dir = package.replace(".", "/")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto in protos:
            rel = f"{pkg_dir}/{proto}"
            argv = ["grpc_tools.protoc", f"-I{AGENT_ROOT}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
            if include:
                argv.append(f"-I{include}")
            argv.append(str(AGENT_ROOT / rel))
            rc = protoc.main(argv)
            if rc != 0:
                raise RuntimeError(f"protoc failed on {rel} (exit {rc})")
            stem = proto[: -len(".proto")]
            gen = Path(tmp) / pkg_dir
            pb2 = gen / f"{stem}_pb2.py"
            grpc_file = gen / f"{stem}_pb2_grpc.py"
            (out_dir / pb2.name).write_text(_postprocess_pb2(pb2.read_text()))
            (out_dir / grpc_file.name).write_text(_postprocess_grpc(grpc_file.read_text(), stem, package))
            written += [out_dir / pb2.name, out_dir / grpc_file.name]
    return written


def generate(out_dir: Path) -> list[Path]:
    """Compile this package's protos into ``out_dir``; return the written files."""
    return compile_protos(PACKAGE, PROTOS, out_dir)


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else HERE
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
