# Sourced by the one-call device scripts (dqw-check.sh, b256-check.sh) after they set `deadline`
# (seconds from the start by which their summary must be out): el = seconds since sourcing, note =
# echo a stage's line and keep it for the summary printed last, left = seconds before deadline.
t0=$(date +%s)
summary=()
el() { echo $(( $(date +%s) - t0 )); }
note() { summary+=("[$(el)s] $1"); echo "== $1"; }
left() { echo $(( deadline - $(el) )); }
# san_start BINARY [VAR=VALUE ...]: compute-sanitizer memcheck, racecheck and synccheck of BINARY's
# reduced grid (FLASHATTN_TEST_REDUCED=1 and the given variables) in the background, `limit`
# seconds each, logs $out/san-TOOL.log, their pids appended to `pids`.
san_start() {
  local tool
  for tool in memcheck racecheck synccheck; do
    (env FLASHATTN_TEST_REDUCED=1 "${@:2}" timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 99 "$1" \
       > "$out/san-$tool.log" 2>&1
     echo "rc=$?" >> "$out/san-$tool.log") & pids+=($!)
  done
}
# san_notes: one summary line (note) per sanitizer log.
san_notes() {
  local f
  for f in "$out"/san-*.log; do
    note "compute-sanitizer $(basename "$f" .log): $(tail -1 "$f") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1) $(grep -E '^\[ +(PASSED|FAILED) +\]' "$f" | tr '\n' ' ')"
  done
}
