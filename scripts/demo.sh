#!/usr/bin/env bash
# `make demo`: the sandbox demo (simulated GPU nodes provisioned with site.yml, seed 003 replayed).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m sandbox demo "$@"
