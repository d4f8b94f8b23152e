#!/usr/bin/env bash
# A bounded libFuzzer campaign of fuzz_capi: starts from the checked-in corpus (copied, so the
# source tree is not written), runs for SECONDS (default 180) on one process, and fails on any
# finding (crash, sanitizer report, oracle abort, leak, a single input slower than 20 s). The input
# that failed is left in the work directory and printed as hex, to be added to the corpus once its
# cause is fixed. Usage: run-fuzz.sh FUZZ_BINARY [SECONDS] [WORK_DIR]
set -euo pipefail
bin=$1
seconds=${2:-180}
work=${3:-$(mktemp -d)}
src=$(cd "$(dirname "$0")" && pwd)/corpus
rm -rf "$work/corpus" "$work/artifacts"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$src"/* "$work/corpus/"
echo "fuzz_capi: $seconds s from $(ls "$src" | wc -l) corpus inputs; work dir $work"
set +e
FLASHATTN_FUZZ_STATS=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=512 -len_control=0 -print_final_stats=1 \
         -artifact_prefix="$work/artifacts/" "$work/corpus" > "$work/fuzz.log" 2>&1
rc=$?
set -e
if [ $rc != 0 ]; then
  grep -v -E '^ *"|^#[0-9]+' "$work/fuzz.log" | tail -60
  for f in "$work"/artifacts/*; do
    [ -f "$f" ] || continue
    echo "failing input $f:"; od -An -tx1 "$f" | head -20
  done
  echo "fuzz_capi: FAILED (rc $rc); log $work/fuzz.log" >&2
  exit 1
fi
grep -E '^fuzz_capi: [0-9]+ inputs|^Done' "$work/fuzz.log" || true
echo "fuzz_capi: no finding in $seconds s"
