#!/usr/bin/env bash
# Smoke of the owner-upload interference probe (called by scripts/test.sh): 2 sessions, 3 s per
# condition, 1 cycle against the debug binaries (closed loop, open loop, control). It must complete, print a `verdict:` line and
# write report.json and a valid timeline.png; the verdict itself is not judged here (CI machines
# are noisy): `--smoke` makes the probe print it as `verdict: (not judged: smoke run ...)
# measured ...` and exit 0 whatever it measured. A crash (exit 2 or anything else), another
# exit status or no such verdict line fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for bin in target/debug/nokv-server target/debug/nokv; do
    if [ ! -x "$bin" ]; then
        echo "probe_smoke: $bin missing; run cargo build --workspace --bins first" >&2
        exit 1
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/nokv-probe-smoke.XXXXXX")
log="$work/probe.log"
python3 scripts/owner_upload_interference_probe.py --smoke \
    --sessions 2 --seconds 3 --cycles 1 \
    --server-bin target/debug/nokv-server --cli-bin target/debug/nokv \
    --out "$work/out" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

fail() {
    echo "probe_smoke: FAILED: $1 (probe exit status $rc; output kept in $work)" >&2
    exit 1
}
case "$rc" in
    0) ;;
    *) fail "the probe crashed, was interrupted or judged its verdict" ;;
esac
grep -q '^verdict: (not judged: smoke run' "$log" || fail "no 'verdict: (not judged ...' line printed"
[ -s "$work/out/report.json" ] || fail "no report.json written"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/out/report.json" \
    || fail "report.json is not valid JSON"
# The probe draws timeline.png itself (standard library only), so it must exist on every run;
# --check-png parses it back (signature, IHDR, every chunk's CRC, IDAT size).
[ -s "$work/out/timeline.png" ] || fail "no timeline.png written"
python3 scripts/owner_upload_interference_probe.py --check-png "$work/out/timeline.png" \
    || fail "timeline.png is not a valid PNG"

# Where the CPU went: the daemon and the sessions in every condition, the uploader while it ran;
# the sessions' CPU per operation (the machine's speed) and the ratios divided by its change.
python3 - "$work/out/report.json" <<'PY' || fail "report.json lacks the CPU by process or the ratios over the machine's speed"
import json, sys
t = json.load(open(sys.argv[1]))["targets"]["candidate"]
c = t["conditions"]
ok = all(c[k]["cpu_cores"]["daemon"] > 0 and c[k]["cpu_cores"]["sessions"] > 0
         and c[k]["session_cpu_ms_per_op"] > 0 for k in c)
adjusted = t["ratios_over_machine_speed"]
ok = ok and all(adjusted[op] > 0 for op in ("stat", "put"))
sys.exit(0 if ok and c["unpaced"]["cpu_cores"]["uploader"] > 0 else 1)
PY
grep -q 'CPU in cores' "$log" || fail "no CPU-by-process table printed"
grep -q "^unpaced p50 vs idle over the sessions' CPU per op" "$log" \
    || fail "no ratios over the machine's speed printed"

verdict=$(grep '^verdict: ' "$log")

# --control: the same run with no uploader at all; it reports the drift and never uploads.
python3 scripts/owner_upload_interference_probe.py --control \
    --sessions 1 --seconds 2 --cycles 1 \
    --server-bin target/debug/nokv-server --cli-bin target/debug/nokv \
    --out "$work/control" > "$work/control.log" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the --control run exited $rc ($(tail -3 "$work/control.log"))"
grep -q '^verdict: CONTROL (no uploader ran' "$work/control.log" \
    || fail "the --control run printed no CONTROL verdict"
python3 - "$work/control/report.json" <<'PY' || fail "the --control run uploaded"
import json, sys
t = json.load(open(sys.argv[1]))["targets"]["candidate"]
sys.exit(0 if t["samples"]["uploads"] == 0 and t["samples"]["session_ops"] > 0 else 1)
PY

# Open loop: sessions at a fixed rate beside an uploader, with the uploader-alone window first;
# the report carries the alone window, the p99 and share lines, and the sessions kept to their
# rate (a closed loop runs hundreds of ops/s here).
python3 scripts/owner_upload_interference_probe.py --smoke --open-loop \
    --sessions 2 --session-rate 20 --upload-mib 8 --seconds 3 --cycles 1 \
    --server-bin target/debug/nokv-server --cli-bin target/debug/nokv \
    --out "$work/open" > "$work/open.log" 2>&1
rc=$?
case "$rc" in
    0) ;;
    *) fail "the --open-loop run crashed or judged its verdict ($(tail -3 "$work/open.log"))" ;;
esac
grep -q '^unpaced uploader vs alone: ' "$work/open.log" \
    || fail "the --open-loop run printed no uploader-vs-alone line"
grep -q '^p99 vs idle: ' "$work/open.log" || fail "the --open-loop run printed no p99 line"
python3 - "$work/open/report.json" <<'PY' || fail "the --open-loop report lacks the alone window or the sessions ran faster than their rate"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["targets"]["candidate"]["conditions"]
offered = 2 * 20 * 2  # sessions x pairs/s x ops per pair
ok = r["conditions_order"][0] == "alone" and c["alone"]["upload"]["mib_per_s"] > 0
ok = ok and c["alone"]["session_ops"] == 0
ok = ok and all(0 < c[k]["ops_per_s"] <= 1.5 * offered for k in ("idle", "unpaced"))
sys.exit(0 if ok else 1)
PY
open_verdict=$(grep '^verdict: ' "$work/open.log")

echo "probe_smoke: ok (the smoke judges no verdict: $verdict; open loop $open_verdict; control run ok)"
rm -rf "$work"
