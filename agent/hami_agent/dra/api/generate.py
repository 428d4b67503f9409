"""Regenerate the committed gRPC stubs of the DRA kubelet plugin from the ``.proto`` files next to this.

Run: ``.venv/bin/python -m hami_agent.dra.api.generate`` (needs grpcio-tools, a dev extra).

The post-processing is the device plugin's (``hami_agent.deviceplugin.api.generate``: no protobuf/grpc
runtime version guards, package-relative imports, no version stamp), so the same stubs work with every
protobuf >= 4.25 and grpcio >= 1.60 this project supports. The plugin-watcher registration API is not
generated here: it is the device plugin's ``pluginregistration.proto`` (one service, one copy).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hami_agent.deviceplugin.api.generate import AGENT_ROOT, _postprocess_pb2

HERE = Path(__file__).resolve().parent
PROTOS = ("dra_v1.proto", "dra_v1beta1.proto", "health_v1.proto", "health_v1alpha1.proto")
PACKAGE = "hami_agent.dra.api"


def _postprocess_grpc(text: str, stem: str) -> str:
    from hami_agent.deviceplugin.api import generate as dp

    text = text.replace(f"from hami_agent.dra.api import {stem}_pb2 as", f"from . import {stem}_pb2 as")
    text = dp._GRPC_GUARD.sub("", text)
    return text.replace("import warnings\n", "")


def generate(out_dir: Path) -> list[Path]:
    """Compile the protos into ``out_dir``; return the written files."""
    from grpc_tools import protoc  # dev dependency, imported only here

    try:
        from importlib.resources import files

        include = str(files("grpc_tools") / "_proto")
    except Exception:  # pragma: no cover - very old grpc_tools
        include = ""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto in PROTOS:
            rel = f"hami_agent/dra/api/{proto}"
            argv = ["grpc_tools.protoc", f"-I{AGENT_ROOT}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
            if include:
                argv.append(f"-I{include}")
            argv.append(str(AGENT_ROOT / rel))
            if protoc.main(argv) != 0:
                raise RuntimeError(f"protoc failed on {rel}")
            stem = proto[: -len(".proto")]
            gen = Path(tmp) / "hami_agent" / "dra" / "api"
            pb2, grpc_file = gen / f"{stem}_pb2.py", gen / f"{stem}_pb2_grpc.py"
            (out_dir / pb2.name).write_text(_postprocess_pb2(pb2.read_text()))
            (out_dir / grpc_file.name).write_text(_postprocess_grpc(grpc_file.read_text(), stem))
            written += [out_dir / pb2.name, out_dir / grpc_file.name]
    return written


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else HERE
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
