#!/usr/bin/env bash
# Installs the Debian packages the build and tests need, only when something is missing.
# Idempotent and quiet when everything is present; refuses politely when not root.
set -euo pipefail

# command-or-file -> package
declare -A NEEDED=(
  [gcc]=gcc
  [make]=make
  [podman]=podman
  [runc]=runc
  [debootstrap]=debootstrap
  [dpkg-scanpackages]=dpkg-dev
  [fakeroot]=fakeroot
)
missing=()
for cmd in "${!NEEDED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEEDED[$cmd]}")
done
# python3-venv: `python3 -m venv` fails without ensurepip on Debian's python.
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing system packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# podman on this machine class: crun fails on cgroup v1 hybrid hosts, runc works.
conf=/etc/containers/containers.conf
if command -v podman >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  if ! grep -qs '^runtime *= *"runc"' "$conf"; then
    mkdir -p /etc/containers
    if grep -qs '^\[engine\]' "$conf"; then
      sed -i '/^\[engine\]/a runtime = "runc"' "$conf"
    else
      printf '[engine]\nruntime = "runc"\n' >>"$conf"
    fi
  fi
fi
