#!/usr/bin/env bash
# A/B timing of kernel variants on the GPU machine, in one call: the working tree is variant "base";
# each NAME=PATCH argument is another variant, the working tree with PATCH applied (`git apply`;
# make one with `git diff > tests/gpu/my.patch` before reverting the edit, or keep patches out of
# git in any non-ignored folder so that they travel). All variants build in parallel (library only,
# the archs below), then bench/compare_torch.py runs once per variant per round, the variants
# alternating within each round so that drift of the GPU's clock falls on all of them alike.
#
#   OUT=$OUT tests/gpu/ab-bench.sh early_k=tests/gpu/early_k.patch
#   ROUNDS=3 TORCH_ARGS="--gens fa3 --hdim 64 --no-decode" RATIO=fa3/cuDNN OUT=$OUT tests/gpu/ab-bench.sh v1=a.patch v2=b.patch
#
# Environment: ROUNDS (default 2); TORCH_ARGS (default: fa2 on the FA3-paper grid, 1k-16k, no decode
# table); RATIO = numerator/denominator column names of compare_torch's table (default
# fa2/torch-flash); FA1_ARCHS / FA2_ARCHS / FA3_ARCHS (default: only what the H200 runs, and only
# FA2 and FA3: FA1_ARCHS empty). Results: $OUT/ab-<variant>-<round>.md and a summary table on
# stdout (one column per variant and round, then each variant's median). Correctness is not
# checked here beyond compare_torch's own error column: run the gpu tests on the variant you keep.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/ab-out}
mkdir -p "$out"
rounds=${ROUNDS:-2}
torch_args=${TORCH_ARGS:---gens fa2 --seqlen 1024,2048,4096,8192,16384 --no-decode}
ratio=${RATIO:-fa2/torch-flash}

names=(base)
patches=("")
for arg in "$@"; do
  case $arg in
    *=*) names+=("${arg%%=*}"); patches+=("${arg#*=}") ;;
    *) echo "ab-bench.sh: expected NAME=PATCH, got '$arg'" >&2; exit 2 ;;
  esac
done

build_variant() {  # name patch
  local name=$1 patch=$2 src=/tmp/ab-src-$1 bld=/tmp/ab-build-$1
  rm -rf "$src" && mkdir -p "$src"
  (cd "$root" && tar --exclude=./.devdeps --exclude='./build*' --exclude=./.git -cf - .) | tar -xf - -C "$src"
  if [ -n "$patch" ]; then
    (cd "$src" && git apply "$root/$patch") || { echo "$name: patch $patch does not apply"; return 1; }
  fi
  if ! cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
      -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
      -DFLASHATTN_FA1_ARCHS="${FA1_ARCHS:-}" -DFLASHATTN_FA2_ARCHS="${FA2_ARCHS:-90-real}" \
      -DFLASHATTN_FA3_ARCHS="${FA3_ARCHS:-90a-real}" > "$out/ab-configure-$name.log" 2>&1; then
    echo "$name: configure failed (see $out/ab-configure-$name.log)"; return 1
  fi
  if ! cmake --build "$bld" --target flashattn -j "$(( $(nproc) / ${#names[@]} + 1 ))" > "$out/ab-build-$name.log" 2>&1; then
    echo "$name: build failed (see $out/ab-build-$name.log)"; return 1
  fi
}

t0=$(date +%s)
pids=()
for i in "${!names[@]}"; do build_variant "${names[$i]}" "${patches[$i]}" & pids+=($!); done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed = 0 ] || exit 1
echo "== built ${#names[@]} variant(s) in $(( $(date +%s) - t0 ))s"

for r in $(seq 1 "$rounds"); do
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # TORCH_ARGS is a list of arguments
    python3 "$root/bench/compare_torch.py" --lib "/tmp/ab-build-$name/src/libflashattn.so" $torch_args \
      --markdown "$out/ab-$name-$r.md" > "$out/ab-$name-$r.log" 2>&1 \
      || echo "$name round $r: compare_torch.py exited with an error (see $out/ab-$name-$r.log)"
  done
done

python3 - "$out" "$ratio" "$rounds" "${names[@]}" <<'PY'
import os, re, statistics, sys
out, ratio, rounds, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
num, den = ratio.split("/")
cells, order = {}, []
for name in names:
    for r in range(1, rounds + 1):
        path = os.path.join(out, f"ab-{name}-{r}.md")
        if not os.path.exists(path):
            continue
        head = None
        for line in open(path):
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if cols and cols[0] == "hdim":
                head = cols  # each table has its own header (the decode table differs)
                continue
            if head is None or len(cols) != len(head) or not cols[0].isdigit() or num not in head or den not in head:
                continue
            try:
                a = float(cols[head.index(num)].rstrip("*"))
                b = float(cols[head.index(den)].rstrip("*"))
            except ValueError:
                continue  # n/a, ERR, skip
            key = " ".join(cols[:3])
            if key not in cells:
                cells[key] = {}
                order.append(key)
            cells[key][(name, r)] = a / b
runs = [(n, r) for n in names for r in range(1, rounds + 1)]
print(f"{ratio} (hdim causal seqlen | " + " ".join(f"{n}#{r}" for n, r in runs) + " | median per variant)")
for key in order:
    row = cells[key]
    vals = " ".join(f"{row[x]:.3f}" if x in row else "-" for x in runs)
    meds = " ".join(f"{n}={statistics.median([row[(n, r)] for r in range(1, rounds + 1) if (n, r) in row]):.3f}"
                    if any((n, r) in row for r in range(1, rounds + 1)) else f"{n}=-" for n in names)
    print(f"{key} | {vals} | {meds}")
PY
