#!/usr/bin/env bash
# Lint the hami.node collection: ansible-lint (production profile) over the whole collection, plus the
# module sanity checks we can run offline (ansible-test sanity needs a pip bootstrap download, so its
# validate-modules core is re-done by tests/unit/plugins/test_module_docs.py).
# Called by `make lint`; run from anywhere. Exit status: non-zero when any check fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${VENV_BIN:-$ROOT/.venv/bin}"
PY="$BIN/python"
status=0

step() { printf '\n== %s\n' "$*"; }

# ansible-doc and ansible-lint resolve hami.node.* through a collections path: a temporary
# ansible_collections/hami/node symlink to this checkout.
COLL="$(mktemp -d)"
trap 'rm -rf "$COLL"' EXIT
mkdir -p "$COLL/ansible_collections/hami"
ln -s "$ROOT" "$COLL/ansible_collections/hami/node"
export ANSIBLE_COLLECTIONS_PATH="$COLL${ANSIBLE_COLLECTIONS_PATH:+:$ANSIBLE_COLLECTIONS_PATH}"

step "ansible-lint --profile production (collection)"
"$BIN/ansible-lint" --profile production --offline || status=1

step "modules compile (python3 -W error)"
"$PY" -W error -m py_compile plugins/modules/*.py plugins/module_utils/*.py || status=1

step "ansible-doc renders every module"
for mod in plugins/modules/*.py; do
    name="$(basename "$mod" .py)"
    if "$BIN/ansible-doc" "hami.node.$name" >/dev/null; then
        echo "ok   hami.node.$name"
    else
        echo "FAIL hami.node.$name"
        status=1
    fi
done

step "DOCUMENTATION/EXAMPLES/RETURN vs argument_spec (validate-modules equivalent)"
"$PY" -m pytest -q -p no:cacheprovider tests/unit/plugins/test_module_docs.py || status=1

step "gpusim stubs are stdlib-only and compile"
for stub in tests/gpusim/bin/nvidia-smi tests/gpusim/bin/nvidia-cuda-mps-control; do
    if grep -nE '^\s*(import|from)\s+(yaml|ansible|hami_agent|tests)\b' "$stub"; then
        echo "FAIL $stub imports a non-stdlib module"
        status=1
    fi
    "$PY" -W error -c "import ast, pathlib, sys; ast.parse(pathlib.Path(sys.argv[1]).read_text())" "$stub" || status=1
done

if [ "$status" -ne 0 ]; then
    echo "lint-ansible: FAILED" >&2
fi
exit "$status"
