"""Regenerate the committed gRPC stubs of the DRA kubelet plugin from the ``.proto`` files next to this.

Run: ``.venv/bin/python -m hami_agent.dra.api.generate`` (needs grpcio-tools, a dev extra).

The post-processing is the device plugin's (``hami_agent.deviceplugin.api.generate``: no protobuf/grpc
runtime version guards, package-relative imports, no version stamp), so the same stubs work with every
protobuf >= 4.25 and grpcio >= 1.60 this project supports. The plugin-watcher registration API is not
generated here: it is the device plugin's ``pluginregistration.proto`` (one service, one copy).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hami_agent.deviceplugin.api.generate import compile_protos

HERE = Path(__file__).resolve().parent
PROTOS = ("dra_v1.proto", "dra_v1beta1.proto", "health_v1.proto", "health_v1alpha1.proto")
PACKAGE = "hami_agent.dra.api"


def generate(out_dir: Path) -> list[Path]:
    """Compile the protos into ``out_dir``; return the written files."""
    return compile_protos(PACKAGE, PROTOS, out_dir)


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else HERE
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
