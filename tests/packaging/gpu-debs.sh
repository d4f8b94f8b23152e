#!/usr/bin/env bash
# The CUDA Debian packages on a GPU machine: install them, run flashattn-info and the demo from
# them, and (optionally) the benchmarks with --json for bench/plot.py.
#
#   tests/packaging/gpu-debs.sh DEBDIR [bench]
#
# DEBDIR holds libflashattn0_*.deb, libflashattn-dev_*.deb and flashattn-tools_*.deb, built
# elsewhere (the GPU machine needs neither debhelper nor a network), e.g. with
#   FLASHATTN_DEB_PROFILES="pkg.flashattn.localcuda nocheck nodoc" \
#   FLASHATTN_DEB_CMAKE_ARGS="-DFLASHATTN_FA1_ARCHS=90-real -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real" \
#   tests/packaging/build-debs.sh DEBDIR
# As root the packages are installed with dpkg -i (and purged at the end unless KEEP=1); otherwise
# (or with UNPACK=1) they are unpacked with dpkg -x into a scratch prefix, and LD_LIBRARY_PATH / the compiler flags
# point there. The demo (examples/flashattn_demo.c) is compiled against the installed headers and
# library with pkg-config (CUDA runtime from FLASHATTN_CUDA_HOME, default /usr/local/cuda, for its
# own cudaMalloc) and run on the automatic backend. With "bench", flashattn-bench and
# bench/compare_torch.py (if torch imports) run a modest grid with --json (BENCH_ARGS / TORCH_ARGS
# replace the grid). Logs and JSON go to OUT (default /tmp/gpu-debs). Exits non-zero when the
# installation, flashattn-info or the demo fails.
set -uo pipefail
debdir=$(cd "${1:?usage: gpu-debs.sh DEBDIR [bench]}" && pwd)
want_bench=${2:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/gpu-debs}
cuda=${FLASHATTN_CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
rc=0
say() { echo "gpu-debs: $*" | tee -a "$out/summary.txt"; }
debs=$(ls "$debdir"/libflashattn0_*.deb "$debdir"/libflashattn-dev_*.deb "$debdir"/flashattn-tools_*.deb)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)

# 1. Install.
if [ "$(id -u)" = 0 ] && [ "${UNPACK:-0}" != 1 ] && dpkg -i $debs > "$out/dpkg.log" 2>&1; then
  mode="dpkg -i"
  root=""
  bindir=/usr/bin
  installed=1
else
  if [ "$(id -u)" = 0 ] && [ "${UNPACK:-0}" != 1 ]; then  # e.g. unmet dependencies: take back what dpkg -i left half-configured
    say "dpkg -i failed (log: dpkg.log); unpacking instead"; tail -5 "$out/dpkg.log"
    dpkg --purge flashattn-tools libflashattn-dev libflashattn0 >> "$out/dpkg.log" 2>&1
  fi
  root=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-root.XXXXXX")
  for f in $debs; do dpkg -x "$f" "$root" || { say "dpkg -x $f failed"; exit 1; }; done
  mode="dpkg -x into $root"
  bindir=$root/usr/bin
  export LD_LIBRARY_PATH=$root/usr/lib/$ma${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  installed=0
fi
say "installed with $mode: $(for f in $debs; do dpkg-deb -f "$f" Package Version | paste -sd' '; done | paste -sd',')"
dpkg-deb -f "$debdir"/libflashattn0_*.deb Description | grep 'CUDA toolkit' | sed 's/^ */gpu-debs: package says: /' | tee -a "$out/summary.txt"
# flashattn-bench links cuBLAS from the toolkit it was built with (no Debian package provides it).
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda/lib64

# 2. flashattn-info from the package.
"$bindir/flashattn-info" --seqlen 8192 --heads 16 --head-dim 128 --dtype bf16 --causal > "$out/flashattn-info.txt" 2>&1
r=$?; say "flashattn-info rc=$r: $(grep -E '^(build|devices|auto):' "$out/flashattn-info.txt" | paste -sd'|')"
[ $r = 0 ] || rc=1

# 3. The demo, built against the installed -dev package.
pcdir=$root/usr/lib/$ma/pkgconfig
if [ -n "$root" ]; then
  cflags="-I$root/usr/include"; libs="-L$root/usr/lib/$ma -lflashattn"   # the .pc says prefix=/usr
else
  cflags=$(pkg-config --cflags flashattn); libs=$(pkg-config --libs flashattn)
fi
say "pkg-config: $(PKG_CONFIG_PATH=$pcdir pkg-config --modversion flashattn 2>&1)"
if cc -O2 -std=c11 -DFLASHATTN_DEMO_WITH_CUDA -I"$cuda/include" "$src/examples/flashattn_demo.c" $cflags $libs \
      -L"$cuda/lib64" -lcudart -lm -o "$out/flashattn-demo" > "$out/demo-build.log" 2>&1; then
  "$out/flashattn-demo" --seqlen 4096 --heads 16 --head-dim 128 --dtype bf16 --causal > "$out/demo.txt" 2>&1
  r=$?; say "demo rc=$r: $(grep -E '^(backend|throughput|max)' "$out/demo.txt" | paste -sd'|')"
  [ $r = 0 ] || rc=1
else
  say "demo build failed: $(tail -3 "$out/demo-build.log" | paste -sd'|')"; rc=1
fi

# 4. Benchmarks with --json (the installed flashattn-bench, compare_torch on the installed library).
if [ "$want_bench" = bench ]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$bindir/flashattn-bench" --backend all-gpu ${BENCH_ARGS:---hdim 64,128,256 --seqlen 512,2048,8192 --no-standard \
      --warmup 2 --reps 5 --max-decode-gb 4 --budget-s 40} --markdown "$out/bench.md" --json "$out/bench.json" \
      > "$out/bench.txt" 2>&1
  say "flashattn-bench rc=$? in $(( $(date +%s) - t0 )) s"
  lib=$(ls "${root:-}/usr/lib/$ma"/libflashattn.so.0 2>/dev/null)
  if python3 -c 'import torch' 2>/dev/null; then
    t0=$(date +%s)
    # shellcheck disable=SC2086
    python3 "$src/bench/compare_torch.py" --lib "$lib" ${TORCH_ARGS:---gens fa2,fa3 --hdim 64,128,256 \
        --seqlen 512,2048,8192 --warmup 2 --reps 5 --decode-batch 1,8 --decode-seqlen 8192,32768 \
        --max-decode-gb 4 --budget-s 45} --markdown "$out/compare_torch.md" --json "$out/compare_torch.json" \
        > "$out/compare_torch.txt" 2>&1
    say "compare_torch rc=$? in $(( $(date +%s) - t0 )) s"
  else
    say "compare_torch: torch does not import here; skipped"
  fi
fi

# 5. Leave the machine as it was.
if [ "$installed" = 1 ] && [ "${KEEP:-0}" != 1 ]; then
  dpkg --purge flashattn-tools libflashattn-dev libflashattn0 >> "$out/dpkg.log" 2>&1 && say "purged"
fi
[ -z "$root" ] || rm -rf "$root"
exit $rc
