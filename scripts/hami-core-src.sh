#!/usr/bin/env bash
# Export a snapshot of HAMi-core's public source (Project-HAMi/HAMi-core) into .hami-core/ (ignored by git),
# to travel with the tree to a lent GPU machine (`carry: [".whl", ".hami-core"]`), where
# scripts/device_check.py --hami-core-src .hami-core builds libvgpu.so from it. Its code never enters this
# repository.
#
#   scripts/hami-core-src.sh SOURCE [DEST] [REF]
#
# SOURCE: a git URL (cloned shallow), a clone, or a bare repository (a mirror); REF default HEAD.
# DEST (default .hami-core) is replaced; DEST/HAMI_CORE_COMMIT names the commit. docs/ (images) is left out.
set -euo pipefail
SRC=${1:?usage: scripts/hami-core-src.sh SOURCE [DEST] [REF]   (e.g. https://github.com/Project-HAMi/HAMi-core.git)}
DEST=${2:-.hami-core}
REF=${3:-HEAD}
tmp=""
cleanup() { [[ -n $tmp ]] && rm -rf "$tmp"; return 0; }
trap cleanup EXIT
if [[ -d $SRC/.git ]]; then
  gitdir=$SRC/.git
elif [[ -f $SRC/HEAD && -d $SRC/objects ]]; then
  gitdir=$SRC
else
  tmp=$(mktemp -d)
  git clone --quiet --depth 1 ${REF:+--no-single-branch} "$SRC" "$tmp/repo"
  gitdir=$tmp/repo/.git
fi
commit=$(git --git-dir="$gitdir" rev-parse "$REF^{commit}")
rm -rf "$DEST"
mkdir -p "$DEST"
git --git-dir="$gitdir" archive "$commit" | tar -x -C "$DEST" --exclude=docs
echo "$commit" >"$DEST/HAMI_CORE_COMMIT"
echo "hami-core-src: $DEST from $SRC at $commit ($(du -sh "$DEST" | cut -f1))"
