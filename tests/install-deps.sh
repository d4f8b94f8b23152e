# Sourced by tests/run.sh and examples/demo.sh: install the Debian packages the build needs and
# this machine lacks (root, or sudo), the Python test packages, and (when nvcc is present) the
# CUDA binary tools the SASS test needs.
# clang and its runtime (libclang-rt-dev: ASan/UBSan shared runtime, libFuzzer) build the
# sanitizer build and the fuzz target (tests/fuzz).
flashattn_deps="cmake ninja-build g++ pkg-config libcmocka-dev doxygen golang-go clang libclang-rt-dev"
missing=""
for p in $flashattn_deps; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends $missing
fi
# The Python binding's tests need numpy, pytest and ml_dtypes (PyPI) in the python3 on PATH.
if ! python3 -c 'import numpy, pytest, ml_dtypes' >/dev/null 2>&1; then
  python3 -m pip install -q -r bindings/python/requirements-test.txt \
    || python3 -m pip install -q --break-system-packages -r bindings/python/requirements-test.txt
fi
# test_fa3_sass reads the FA3 kernels' SASS with cuobjdump, which calls nvdisasm. A CUDA install
# with only the compiler (a fresh CI machine) lacks both: take NVIDIA's PyPI wheels of the nvcc's
# major version into FLASHATTN_CUDA_TOOLS_PREFIX (default: a per-user cache, outside the source
# tree) and export its bin directory as FLASHATTN_CUDA_TOOLS_BIN, where CMake looks first.
flashattn_cuda_tools() {
  local nvcc_bin major prefix bin
  nvcc_bin=$(command -v nvcc || true)
  [ -n "$nvcc_bin" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc; }
  [ -n "$nvcc_bin" ] || return 0
  if [ -x "$(dirname "$nvcc_bin")/cuobjdump" ] && [ -x "$(dirname "$nvcc_bin")/nvdisasm" ]; then
    return 0
  fi
  major=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  prefix=${FLASHATTN_CUDA_TOOLS_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/flashattn/cuda-tools-$major}
  # The wheels' layout differs between CUDA majors (nvidia/cu13/bin, nvidia/cuda_*/bin): find it.
  bin=$(dirname "$(find "$prefix/nvidia" -name cuobjdump -type f 2>/dev/null | head -1)")
  if ! [ -x "$bin/cuobjdump" ] || ! [ -x "$bin/nvdisasm" ]; then
    echo "installing: nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ($major.*) into $prefix"
    python3 -m pip install -q --upgrade --target "$prefix" \
      "nvidia-cuda-cuobjdump==$major.*" "nvidia-cuda-nvdisasm==$major.*"
    bin=$(dirname "$(find "$prefix/nvidia" -name cuobjdump -type f | head -1)")
    # One wheel per tool: nvdisasm may sit in a directory of its own; cuobjdump finds it on PATH.
    local disasm
    disasm=$(find "$prefix/nvidia" -name nvdisasm -type f | head -1)
    [ -x "$bin/nvdisasm" ] || ln -sf "$disasm" "$bin/nvdisasm"
  fi
  export FLASHATTN_CUDA_TOOLS_BIN=$bin
}
flashattn_cuda_tools
