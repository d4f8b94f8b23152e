#!/usr/bin/env bash
# A/B of the working tree against an older source tree, on the GPU machine, in one call: both
# libraries build in parallel (sm_90 only), their kernels' registers / stack / SASS instruction
# counts are tabled side by side (cuobjdump), then bench/ab_libs.py times both in one process,
# cell by cell, rounds alternated. For refactors that must keep every kernel's speed.
#
#   git archive <old-commit> src include cmake CMakeLists.txt CMakePresets.json flashattn.pc.in \
#       LICENSE tools | gzip > .ab/old.tgz      # .ab/ ignored; carry it
#   OUT=$OUT tests/gpu/ab-libs.sh .ab/old.tgz
#
# Environment: AB_ARGS (bench/ab_libs.py arguments; default all generations, FA3-paper grid, bf16,
# 3 rounds). Results: $OUT/ab-libs.md, $OUT/kernels.md.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/ab-out}
old_tgz=$1
mkdir -p "$out" /tmp/ab-old-src
tar -xzf "$old_tgz" -C /tmp/ab-old-src || exit 1

build() {  # src build-dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_BENCH=OFF \
    -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_FA1_ARCHS=90-real -DFLASHATTN_FA2_ARCHS=90-real \
    -DFLASHATTN_FA3_ARCHS=90a-real > "$2.configure.log" 2>&1 && cmake --build "$2" --target flashattn -j 8 > "$2.build.log" 2>&1
}
t0=$(date +%s)
build /tmp/ab-old-src /tmp/ab-old & p1=$!
build "$root" /tmp/ab-new & p2=$!
wait $p1 || { echo "old build failed"; tail -20 /tmp/ab-old.build.log; exit 1; }
wait $p2 || { echo "new build failed"; tail -20 /tmp/ab-new.build.log; exit 1; }
echo "== built both in $(( $(date +%s) - t0 ))s; sizes: old $(stat -L -c %s /tmp/ab-old/src/libflashattn.so) new $(stat -L -c %s /tmp/ab-new/src/libflashattn.so) bytes"

python3 - /tmp/ab-old/src/libflashattn.so /tmp/ab-new/src/libflashattn.so > "$out/kernels.md" <<'PY'
import re, subprocess, sys
def rename(fn):  # FA1's element tags before the one PTX vocabulary (cuda::sm75::Half / BHalf);
    # anonymous namespaces carry a per-build hash
    fn = fn.replace("4sm754HalfE", "4Fp16E").replace("4sm755BHalfE", "4Bf16E")
    return re.sub(r"\d{2}_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_cu_[0-9a-f]{8}", r"anon_\1", fn)
def kernels(lib):
    res = subprocess.run(["cuobjdump", "--dump-resource-usage", lib], capture_output=True, text=True).stdout
    info, fn = {}, None
    for line in res.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m: fn = rename(m.group(1)); continue
        m = re.search(r"REG:(\d+) STACK:(\d+)", line)
        if m and fn: info[fn] = [int(m.group(1)), int(m.group(2)), 0]
    sass = subprocess.run(["cuobjdump", "-sass", lib], capture_output=True, text=True).stdout
    fn = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m: fn = rename(m.group(1)); continue
        if fn in info and re.search(r"/\*[0-9a-f]{4,}\*/\s+\S", line): info[fn][2] += 1
    return info
old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
print("| kernel | regs old | regs new | stack old | stack new | SASS instr old | SASS instr new |")
print("|---|---|---|---|---|---|---|")
same = 0
for fn in sorted(set(old) | set(new)):
    o, n = old.get(fn, ["-"] * 3), new.get(fn, ["-"] * 3)
    same += o == n
    short = fn[:90]
    print(f"| {short} | {o[0]} | {n[0]} | {o[1]} | {n[1]} | {o[2]} | {n[2]} |")
print(f"\n{same} of {len(set(old) | set(new))} kernels identical in registers, stack and instruction count.")
PY
tail -1 "$out/kernels.md"
# shellcheck disable=SC2086  # AB_ARGS is a list of arguments
python3 "$root/bench/ab_libs.py" --a /tmp/ab-old/src/libflashattn.so --b /tmp/ab-new/src/libflashattn.so \
  ${AB_ARGS:---gens fa1,fa2,fa3 --rounds 3} --markdown "$out/ab-libs.md" > "$out/ab-libs.log" 2>&1
echo "== ab_libs rc=$?"
grep -E "^- |Total" "$out/ab-libs.md"
awk -F'|' 'NR > 5 && $8+0 > 0 && $8+0 < 0.98 { print "slower >2%:" $0 }' "$out/ab-libs.md"
