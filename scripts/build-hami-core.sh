#!/usr/bin/env bash
# Build HAMi-core's libvgpu.so from a HAMi-core source tree with this machine's CMake and CUDA toolkit.
#
#   scripts/build-hami-core.sh SRC [OUT]      # OUT default: ./hami-core-build; writes OUT/libvgpu.so
#
# SRC is the public Project-HAMi/HAMi-core source (`make hami-core-src` exports a snapshot into the ignored
# .hami-core/; its code never enters this repository). The tree is copied to OUT/src and built there with
# the options of HAMi-core's own build.sh (DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE,
# HOOK_NVML_ENABLE, CMAKE_BUILD_TYPE=Debug), target `vgpu` only. Two adjustments, both in the copy:
#  - `add_subdirectory(test)` is dropped: HAMi-core's tests need FindCUDA and a GPU-side toolchain we do
#    not use here (only libvgpu.so is built);
#  - when the linker cannot find libcuda.so / libnvidia-ml.so (a driver installs only the .so.1 files, a
#    pip-installed toolkit has no stubs), OUT/linkstubs gets symlinks to the driver's .so.1, else tiny
#    stub libraries with the right soname: libvgpu.so then loads the real driver libraries at run time.
# nvml.h comes from the toolkit, else from the nvidia-nvml-dev wheel on PYTHONPATH (.whl carries it).
# Needs cmake, make, gcc and nvcc (or CUDA_HOME). Writes nothing outside OUT. Exit 0 = OUT/libvgpu.so built.
set -euo pipefail

SRC=${1:?usage: scripts/build-hami-core.sh SRC [OUT]}
OUT=${2:-hami-core-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}

die() { echo "build-hami-core: $*" >&2; exit 1; }
[[ -f $SRC/CMakeLists.txt && -d $SRC/src ]] || die "$SRC is not a HAMi-core source tree (no CMakeLists.txt, src/)"
command -v cmake >/dev/null || die "cmake not found"
command -v make >/dev/null || die "make not found"

if [[ -z ${CUDA_HOME:-} ]]; then
  for c in $(command -v nvcc >/dev/null && dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")") \
           /usr/local/cuda /usr/local/cuda-* /usr/lib/cuda; do
    [[ -f $c/include/cuda.h ]] && { CUDA_HOME=$c; break; }
  done
  [[ -n ${CUDA_HOME:-} ]] || die "no CUDA toolkit found (cuda.h): set CUDA_HOME"
fi
[[ -f $CUDA_HOME/include/cuda.h ]] || die "$CUDA_HOME/include/cuda.h not found (CUDA_HOME=$CUDA_HOME)"
export CUDA_HOME

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/src" "$OUT/build" "$OUT/linkstubs"
cp -a "$SRC" "$OUT/src"
sed -i 's|^[[:space:]]*add_subdirectory(test)|# add_subdirectory(test)  # dropped by build-hami-core.sh: only libvgpu.so is built|' \
  "$OUT/src/CMakeLists.txt"

# nvml.h: the toolkit's, else a wheel's (nvidia-nvml-dev: nvidia/cu*/include/nvml.h on PYTHONPATH)
EXTRA_INC=""
if [[ ! -f $CUDA_HOME/include/nvml.h ]]; then
  found=""
  IFS=: read -r -a pp <<<"${PYTHONPATH:-}"
  for d in "${pp[@]}" $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null); do
    for h in "$d"/nvidia/*/include/nvml.h "$d"/nvidia/nvml/include/nvml.h; do
      [[ -f $h ]] && { found=$(dirname "$h"); break 2; }
    done
  done
  for h in /usr/include/nvml.h "$CUDA_HOME"/targets/*/include/nvml.h; do
    [[ -z $found && -f $h ]] && found=$(dirname "$h")
  done
  [[ -n $found ]] || die "nvml.h not found in $CUDA_HOME/include, /usr/include or a nvidia-nvml-dev wheel on PYTHONPATH"
  EXTRA_INC="-I$found"
  echo "build-hami-core: nvml.h from $found"
fi

# link-time libcuda.so / libnvidia-ml.so
mkdir -p "$OUT/linkstubs"
link_lib() {  # NAME (cuda | nvidia-ml)
  local name=$1 so=lib$1.so real=""
  if echo 'int main(void){return 0;}' | ${CC:-gcc} -x c - -o /dev/null -l"$name" ${LIBRARY_PATH:+-L$LIBRARY_PATH} 2>/dev/null; then
    return 0  # the linker finds it already
  fi
  if [[ -f $CUDA_HOME/lib64/stubs/$so ]]; then
    ln -sf "$CUDA_HOME/lib64/stubs/$so" "$OUT/linkstubs/$so"; echo "build-hami-core: $so -> toolkit stub"; return 0
  fi
  real=$(ldconfig -p 2>/dev/null | awk -v n="$so.1" '$1 == n && /x86-64|x86_64|aarch64|AArch64/ {print $NF; exit}')
  if [[ -n $real ]]; then
    ln -sf "$real" "$OUT/linkstubs/$so"; echo "build-hami-core: $so -> $real"; return 0
  fi
  echo 'void hami_core_link_stub(void) {}' >"$OUT/linkstubs/stub.c"
  ${CC:-gcc} -shared -fPIC -Wl,-soname,"$so.1" -o "$OUT/linkstubs/$so" "$OUT/linkstubs/stub.c"
  echo "build-hami-core: $so -> an empty link stub (soname $so.1; the driver's library is loaded at run time)"
}
link_lib cuda
link_lib nvidia-ml
export LIBRARY_PATH="$OUT/linkstubs${LIBRARY_PATH:+:$LIBRARY_PATH}"

commit=$(cat "$SRC/HAMI_CORE_COMMIT" 2>/dev/null || git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
{
  echo "hami-core commit: $commit"
  echo "cmake: $(cmake --version | head -1)"
  echo "nvcc: $(command -v nvcc >/dev/null && nvcc --version | tail -1 || echo none)"
  echo "CUDA_HOME: $CUDA_HOME"
  echo "gcc: $(${CC:-gcc} --version | head -1)"
} >"$OUT/BUILD_INFO"
cat "$OUT/BUILD_INFO"

mkdir -p "$OUT/build"
cd "$OUT/build"
# HAMi-core's build.sh options; CMAKE_POLICY_VERSION_MINIMUM lets CMake >= 4 accept its cmake_minimum_required(2.8)
cmake ../src -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 \
  -DCMAKE_BUILD_TYPE=Debug -DTEST_DEVICE_ID=0 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  ${EXTRA_INC:+-DCMAKE_C_FLAGS="$EXTRA_INC"} ${EXTRA_INC:+-DCMAKE_CXX_FLAGS="$EXTRA_INC"}
make -j"$JOBS" vgpu
lib=$(find "$OUT/build" -name libvgpu.so -type f | head -1)
[[ -n $lib ]] || die "make finished but no libvgpu.so under $OUT/build"
cp "$lib" "$OUT/libvgpu.so"
echo "build-hami-core: built $OUT/libvgpu.so ($(stat -c %s "$OUT/libvgpu.so") bytes) from $commit"
