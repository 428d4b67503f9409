#!/usr/bin/env bash
# Download the Python wheels a lent GPU machine lacks into .whl/ (ignored by git), for Python 3.12 on
# x86-64 manylinux: they travel with the tree (`carry: [".whl", ...]`) and are installed there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#
#   scripts/device-wheels.sh [DEST]        # DEST default .whl; PYTHON (the venv whose versions are taken)
#
# The lent machine's Python has grpcio, protobuf, nvidia-ml-py, prometheus-client, PyYAML, requests,
# urllib3, python-dateutil, certifi, idna, charset-normalizer and PyTorch (docs/hardware.md); what the agent
# and the simulators import besides is below. Each package comes in the version this checkout's venv tests
# with (one version of each: DEST is emptied first); nvidia-nvml-dev (nvml.h, for build-hami-core.sh when
# the machine's CUDA toolkit has none) is pinned.
set -euo pipefail
DEST=${1:-.whl}
PY=${PYTHON:-.venv/bin/python}
PYVER=${DEVICE_PYTHON_VERSION:-3.12}
# imported by hami_agent.k8s (kubernetes 37 pulls in pydantic; orjson), hami_agent.httpserve (httptools), doctor --query
PACKAGES=(kubernetes durationpy oauthlib requests-oauthlib websocket-client pydantic pydantic-core annotated-types
          typing-inspection typing-extensions httptools jmespath orjson)
PINNED=("nvidia-nvml-dev==13.4.92")

[[ -x $PY ]] || { echo "device-wheels: $PY not found (run make setup, or set PYTHON)" >&2; exit 1; }
specs=()
for p in "${PACKAGES[@]}"; do
  v=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$p" 2>/dev/null) ||
    { echo "device-wheels: $p is not installed in $PY's environment" >&2; exit 1; }
  specs+=("$p==$v")
done
specs+=("${PINNED[@]}")
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${specs[@]}"
ls -1 "$DEST"
echo "device-wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
