#!/usr/bin/env bash
# Molecule's dependency step for every scenario (extensions/molecule/config.yml): makes a plain
# `molecule test -s <scenario>` from the repository root work without hand-set environment variables.
#   preflight.sh PROJECT_DIR EPHEMERAL_DIR IMAGE
# 1. fails early, naming the command that fixes it, when podman, the node image, the simulated apt
#    repository or gpusim's library is missing (it builds nothing: those builds take minutes);
# 2. links this checkout as the collection hami.node under EPHEMERAL_DIR/collections, the path
#    config.yml gives ANSIBLE_COLLECTIONS_PATH (FQCN roles and modules need
#    <path>/ansible_collections/hami/node).
set -euo pipefail
project=${1:?usage: preflight.sh PROJECT_DIR EPHEMERAL_DIR IMAGE}
ephemeral=${2:?usage: preflight.sh PROJECT_DIR EPHEMERAL_DIR IMAGE}
image=${3:?usage: preflight.sh PROJECT_DIR EPHEMERAL_DIR IMAGE}

fail() {
  echo "hami.node molecule preflight: $*" >&2
  exit 1
}

command -v podman >/dev/null || fail "podman is not installed: run scripts/install-system-deps.sh"
podman image exists "$image" \
  || fail "the node image $image is missing: build it with tests/images/build-image.sh (or run make molecule S=<scenario>)"
[[ -f $project/tests/images/build/apt-repo/Packages ]] \
  || fail "the simulated NVIDIA apt repository is missing: build it with tests/images/build-apt-repo.sh (or run make molecule S=<scenario>)"
[[ -f $project/tests/gpusim/build/libnvidia-ml.so.1 ]] \
  || fail "gpusim's libnvidia-ml.so.1 is missing: run make setup"

link=$ephemeral/collections/ansible_collections/hami/node
mkdir -p "$(dirname "$link")"
ln -sfn "$project" "$link"
echo "hami.node molecule preflight: image $image, apt repository and gpusim present; collection $link -> $project"
