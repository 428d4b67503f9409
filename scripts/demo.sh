#!/usr/bin/env bash
# `make demo`: runs, on the simulated seed-003 node, everything that is built so far.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m hami_agent.demo "$@"
