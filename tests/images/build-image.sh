#!/usr/bin/env bash
# Builds the local podman image the molecule scenarios run: Debian 12 (bookworm) minbase with systemd as
# PID 1, python3 and python3-apt (the apt module needs it), imported as localhost/hami-node-test:bookworm.
#
# No registry is involved: the root filesystem comes from debootstrap against the Debian mirror this
# machine's apt sources already use (read at run time; no host name lives in this repository).
#
# Cached: the image carries a label with the hash of this script; when an image with the same hash exists
# the script does nothing. Set HAMI_IMAGE_REBUILD=1 to force a rebuild.
set -euo pipefail

IMAGE=${HAMI_TEST_IMAGE:-localhost/hami-node-test:bookworm}
SUITE=bookworm
# python3-apt: ansible.builtin.apt; python3-yaml: kubelet_config module; apt-utils: apt-ftparchive/
# debconf quietness; kmod/iproute2 are not needed (no kernel in a container).
PACKAGES=python3,python3-apt,python3-yaml,systemd,systemd-sysv,dbus,sudo,procps,apt-utils,ca-certificates
LABEL_KEY=io.hami-node.build-hash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
want_hash=$( (cat "${BASH_SOURCE[0]}"; echo "$PACKAGES $SUITE") | sha256sum | cut -c1-16)

log() { echo "build-image: $*" >&2; }

if [[ ${HAMI_IMAGE_REBUILD:-0} != 1 ]] && podman image exists "$IMAGE"; then
  have_hash=$(podman image inspect --format "{{ index .Labels \"$LABEL_KEY\" }}" "$IMAGE" 2>/dev/null || true)
  if [[ $have_hash == "$want_hash" ]]; then
    log "$IMAGE is up to date (hash $want_hash)"
    exit 0
  fi
  log "$IMAGE exists with hash '${have_hash}', want $want_hash: rebuilding"
fi

for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || { log "missing '$tool': run scripts/install-system-deps.sh as root"; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { log "debootstrap needs root"; exit 1; }

# The mirror: first URI of a deb source carrying Debian's main suite, from deb822 .sources files or the
# one-line format. The machine's apt configuration is the single source of truth.
mirror=${HAMI_DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
  mirror=$(python3 "$here/apt_mirror.py" "$SUITE") || { log "no Debian mirror for '$SUITE' in /etc/apt sources; set HAMI_DEBIAN_MIRROR"; exit 1; }
fi
log "debootstrap $SUITE from $mirror"

work=$(mktemp -d /var/tmp/hami-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2
  log "debootstrap failed (full log above)"
  exit 1
}

# Tests bring their own apt source (the local dummy NVIDIA repo); an image that points at a network
# mirror would make every `apt update` in a scenario slow and flaky.
: >"$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
# No getty/udev work in a container; keeps boot fast and `systemctl is-system-running` clean.
for unit in getty@tty1.service console-getty.service systemd-udevd.service systemd-udev-trigger.service \
  systemd-remount-fs.service systemd-logind.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
echo "hami-node-test" >"$rootfs/etc/hostname"
# The image is a test double of a node: mark it so roles can tell (e.g. docs, diagnostics).
mkdir -p "$rootfs/etc/hami"
echo "simulated node image built by tests/images/build-image.sh" >"$rootfs/etc/hami/simulated-node"

tar -C "$rootfs" -c . | podman import --quiet \
  --change "LABEL $LABEL_KEY=$want_hash" \
  --change 'CMD ["/sbin/init"]' \
  --change 'ENV container=podman' \
  - "$IMAGE" >/dev/null
log "built $IMAGE (hash $want_hash)"
