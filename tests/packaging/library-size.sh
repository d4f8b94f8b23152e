#!/usr/bin/env bash
# Prints the size of a build's libflashattn (the file, its CUDA fatbin and host code) and fails when
# the file exceeds the budget: issue 22 keeps the library at or below 60 MB as kernels are added.
#
#   tests/packaging/library-size.sh BUILD_DIR      (FLASHATTN_MAX_LIBRARY_MB: default 60)
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR}
limit_mb=${FLASHATTN_MAX_LIBRARY_MB:-60}
lib=$(ls "$build"/src/libflashattn.so.*.*.* 2>/dev/null | head -n 1)
[ -n "$lib" ] || { echo "library-size: no libflashattn.so.X.Y.Z in $build/src" >&2; exit 1; }
bytes=$(stat -c %s "$lib")
section() {  # size in bytes of an ELF section (0 when absent)
  local hex
  hex=$(readelf -SW "$lib" | sed -n "s/.*\] $1 *[A-Z_]* *[0-9a-f]* *[0-9a-f]* *\([0-9a-f]*\) .*/\1/p" | head -n 1)
  echo $((16#${hex:-0}))
}
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
archs() { sed -n "s/^FLASHATTN_$1_ARCHS:STRING=//p" "$build/CMakeCache.txt"; }
what="CPU-only build"
if grep -x 'FLASHATTN_ENABLE_CUDA:BOOL=ON' "$build/CMakeCache.txt" >/dev/null; then
  what="FA1 [$(archs FA1)] FA2 [$(archs FA2)] FA3 [$(archs FA3)]"
fi
echo "library-size: $(basename "$lib"): $(mb "$bytes") (.nv_fatbin $(mb "$(section .nv_fatbin)")," \
     ".text $(mb "$(section .text)")); $what"
if [ "$bytes" -gt $((limit_mb * 1000000)) ]; then
  echo "library-size: FAIL: $(mb "$bytes") is over the budget of $limit_mb MB (FLASHATTN_MAX_LIBRARY_MB)" >&2
  exit 1
fi
