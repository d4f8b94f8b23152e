# Sourced by the device scripts: Debian's cmocka packages, carried in DIR/.devdeps
# (../shared/tools/device-deps.sh), unpacked there and put on CMake's and the loader's paths, so
# that the tests build and run on the GPU machine (which has no cmocka). No .devdeps: a warning.
use_devdeps() {  # DIR (the repository root)
  local dir=$1 f
  if [ ! -d "$dir/.devdeps" ]; then
    # Said on stderr and in the caller's log: without it every test target fails to configure and
    # the scripts' summaries read like a broken candidate (stop 43 lost a device call that way).
    echo "WARNING: no $dir/.devdeps (cmocka): tests will not configure; run ../shared/tools/device-deps.sh and carry .devdeps" >&2
    return 0
  fi
  mkdir -p "$dir/.devdeps/root"
  for f in "$dir"/.devdeps/*.deb; do dpkg -x "$f" "$dir/.devdeps/root"; done
  export CMAKE_PREFIX_PATH=$dir/.devdeps/root/usr
  export LD_LIBRARY_PATH=$dir/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
}
# libflashattn_cp's NCCL transport: NCCL from /usr/local/cuda, else torch's nvidia/nccl wheel
# (exported as NCCL_ROOT for cp/CMakeLists.txt); an NCCL_ROOT already set is kept.
use_torch_nccl() {
  if [ -n "${NCCL_ROOT:-}" ] || [ -f /usr/local/cuda/include/nccl.h ]; then return 0; fi
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null); export NCCL_ROOT
}
