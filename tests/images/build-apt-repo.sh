#!/usr/bin/env bash
# Builds a local flat apt repository of SIMULATED NVIDIA driver packages for the molecule scenarios.
#
# The packages are named, versioned and split like Ubuntu's nvidia-graphics-drivers-570 source package
# (full Debian versions, e.g. 570.172.08-0ubuntu1), so apt pinning by source package, dpkg holds, upgrades,
# downgrades and the known-bad refusal are exercised with the real apt. Their payload is gpusim:
#   libnvidia-compute-570   libnvidia-ml.so.1 (gpusim's C NVML) + postinst: user-space driver version
#   nvidia-utils-570        /usr/bin/nvidia-smi (gpusim stub)
#   nvidia-compute-utils-570 /usr/bin/nvidia-cuda-mps-control (gpusim stub), nvidia-persistenced (+unit)
#   nvidia-kernel-common-570 /usr/lib/gpusim/driver-state + gpusim-module-load.service (boot-time "modprobe")
#   nvidia-dkms-570         the "kernel module": /usr/lib/gpusim/module/nvidia.version
#   nvidia-driver-570       metapackage: Depends utils, libs, dkms; only *Recommends* compute-utils, so a
#                           --no-install-recommends install leaves the node without nvidia-cuda-mps-control
#                           (the state seed 003 found after its driver upgrade).
# Versions: 570.158.01 (known-bad: NVML hang with mixed MIG + full GPUs), 570.172.08 (the fix) and
# 570.195.03 (a later R570 build: the target of the rollout tests' driver pin change).
#
# Output: tests/images/build/apt-repo (Packages, Packages.gz, Release, *.deb), served to containers as
# `deb [trusted=yes] file:/srv/hami-apt ./` through a read-only bind mount. Cached by a hash of all inputs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${HAMI_APT_REPO:-$here/build/apt-repo}
GPUSIM_LIB=${GPUSIM_LIB:-$root/tests/gpusim/build/libnvidia-ml.so.1}
GPUSIM_SMI=${GPUSIM_SMI:-$root/tests/gpusim/bin/nvidia-smi}
GPUSIM_MPS=${GPUSIM_MPS:-$root/tests/gpusim/bin/nvidia-cuda-mps-control}
BRANCH=570
VERSIONS=(${HAMI_APT_VERSIONS:-570.158.01 570.172.08 570.195.03})
DEBREV=0ubuntu1

log() { echo "build-apt-repo: $*" >&2; }

[[ -f $GPUSIM_LIB ]] || make --no-print-directory -C "$root/tests/gpusim" >&2 || true
for f in "$GPUSIM_LIB" "$GPUSIM_SMI" "$GPUSIM_MPS"; do
  [[ -f $f ]] || { log "missing gpusim artifact $f (build it: make -C tests/gpusim)"; exit 1; }
done
for tool in dpkg-deb dpkg-scanpackages fakeroot; do
  command -v "$tool" >/dev/null || { log "missing '$tool': run scripts/install-system-deps.sh"; exit 1; }
done

arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")
want_hash=$( (cat "${BASH_SOURCE[0]}" "$here"/nvidia-debs/* "$GPUSIM_LIB" "$GPUSIM_SMI" "$GPUSIM_MPS"
  echo "${VERSIONS[*]} $DEBREV $arch") | sha256sum | cut -c1-16)
if [[ -f $out/.build-hash && $(cat "$out/.build-hash") == "$want_hash" ]]; then
  log "$out is up to date (hash $want_hash)"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/hami-apt.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$out.new"
mkdir -p "$out.new"

# mkpkg NAME VERSION ARCH DESCRIPTION DEPENDS RECOMMENDS -> $work/NAME/ staging dir (caller fills files)
control() {
  local name=$1 version=$2 arch=$3 desc=$4 depends=$5 recommends=$6 dir=$work/$1_$2
  mkdir -p "$dir/DEBIAN"
  {
    echo "Package: $name"
    echo "Source: nvidia-graphics-drivers-$BRANCH"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: hami.node tests <tests@hami-node.invalid>"
    echo "Section: non-free/libs"
    echo "Priority: optional"
    [[ -n $depends ]] && echo "Depends: $depends"
    [[ -n $recommends ]] && echo "Recommends: $recommends"
    echo "Description: $desc (SIMULATED, gpusim)"
    echo " Dummy package for hami.node tests: same name, version and split as the Ubuntu"
    echo " package, payload from the gpusim simulated GPU node. Not a driver."
  } >"$dir/DEBIAN/control"
  echo "$dir"
}

build() {
  local dir=$1
  find "$dir" -type d -exec chmod 0755 {} +
  fakeroot dpkg-deb --root-owner-group -Zxz --build "$dir" "$out.new/" >/dev/null
}

for upstream in "${VERSIONS[@]}"; do
  v="$upstream-$DEBREV"
  same="(= $v)"

  d=$(control nvidia-kernel-common-$BRANCH "$v" all "Shared files used with the kernel module" "python3" "")
  install -D -m0755 "$here/nvidia-debs/driver-state" "$d/usr/lib/gpusim/driver-state"
  install -D -m0644 "$here/nvidia-debs/gpusim-module-load.service" "$d/lib/systemd/system/gpusim-module-load.service"
  cat >"$d/DEBIAN/postinst" <<'PI'
#!/bin/sh
set -e
# enable the boot-time "module load"; never start it here: a new module is loaded only by a reboot
if [ "$1" = configure ]; then
  deb-systemd-helper enable gpusim-module-load.service >/dev/null 2>&1 || systemctl enable gpusim-module-load.service >/dev/null 2>&1 || true
fi
PI
  chmod 0755 "$d/DEBIAN/postinst"
  build "$d"

  d=$(control nvidia-dkms-$BRANCH "$v" "$arch" "NVIDIA DKMS package (kernel module)" "nvidia-kernel-common-$BRANCH $same" "")
  install -d "$d/usr/lib/gpusim/module"
  echo "$upstream" >"$d/usr/lib/gpusim/module/nvidia.version"
  chmod 0644 "$d/usr/lib/gpusim/module/nvidia.version"
  build "$d"

  d=$(control libnvidia-compute-$BRANCH "$v" "$arch" "NVIDIA libcompute package (NVML)" "nvidia-kernel-common-$BRANCH $same" "")
  install -D -m0644 "$GPUSIM_LIB" "$d/usr/lib/$multiarch/libnvidia-ml.so.$upstream"
  ln -s "libnvidia-ml.so.$upstream" "$d/usr/lib/$multiarch/libnvidia-ml.so.1"
  cat >"$d/DEBIAN/postinst" <<PI
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
  ldconfig || true
  /usr/lib/gpusim/driver-state userspace $upstream
fi
PI
  chmod 0755 "$d/DEBIAN/postinst"
  build "$d"

  d=$(control nvidia-utils-$BRANCH "$v" "$arch" "NVIDIA driver support binaries (nvidia-smi)" "python3, libnvidia-compute-$BRANCH $same" "")
  install -D -m0755 "$GPUSIM_SMI" "$d/usr/bin/nvidia-smi"
  build "$d"

  d=$(control nvidia-compute-utils-$BRANCH "$v" "$arch" "NVIDIA compute utilities (MPS, persistenced)" "python3, libnvidia-compute-$BRANCH $same" "")
  install -D -m0755 "$GPUSIM_MPS" "$d/usr/bin/nvidia-cuda-mps-control"
  install -D -m0755 "$here/nvidia-debs/nvidia-persistenced" "$d/usr/bin/nvidia-persistenced"
  install -D -m0644 "$here/nvidia-debs/nvidia-persistenced.service" "$d/lib/systemd/system/nvidia-persistenced.service"
  build "$d"

  d=$(control nvidia-driver-$BRANCH "$v" "$arch" "NVIDIA driver metapackage" \
    "nvidia-utils-$BRANCH $same, libnvidia-compute-$BRANCH $same, nvidia-dkms-$BRANCH $same, nvidia-kernel-common-$BRANCH $same" \
    "nvidia-compute-utils-$BRANCH $same")
  build "$d"
done

(cd "$out.new" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null >Packages && gzip -9nk Packages)
# Release by hand (apt-ftparchive is not installed here): enough for `file:` sources with [trusted=yes].
{
  echo "Origin: hami-node-test"
  echo "Label: hami-node simulated NVIDIA packages"
  echo "Suite: stable"
  echo "Codename: hami-test"
  echo "Date: $(LC_ALL=C date -u -d @0 '+%a, %d %b %Y %H:%M:%S UTC')"
  echo "Architectures: $arch all"
  echo "SHA256:"
  for f in Packages Packages.gz; do
    printf ' %s %s %s\n' "$(sha256sum "$out.new/$f" | cut -d' ' -f1)" "$(stat -c%s "$out.new/$f")" "$f"
  done
} >"$out.new/Release"
echo "$want_hash" >"$out.new/.build-hash"
chmod -R a+rX "$out.new"
rm -rf "$out"
mv "$out.new" "$out"
log "built $out: $(ls "$out"/*.deb | wc -l) packages (hash $want_hash)"
