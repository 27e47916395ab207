#!/usr/bin/env bash
# Runs more fault schedules than CI does (tests/tests/chaos.rs): each seed is one schedule of
# kill -9s, provider faults (NOKV_TEST_FAULTS) and lost client responses against the real
# daemon, followed by the invariant checks. Then as many provider-durability schedules
# (tests/tests/failover.rs): a 3-node cluster whose owner is killed -9 and its data dir
# deleted while every provider create (log segments included) may be refused or land with
# its answer lost. One process per seed, so one failure does not hide the next. Prints one
# line per failing seed with the command that replays it, then `N passed, M failed`; exits 1
# if any failed.
#
#   scripts/chaos.sh [--runs N] [--seed S]     (defaults: 20 runs of each from seed 1000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=20
seed=1000
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) echo "scripts/chaos.sh: unknown argument $1 (use --runs N --seed S)" >&2; exit 2 ;;
    esac
done
case "$runs$seed" in
    *[!0-9]*|'') echo "scripts/chaos.sh: --runs and --seed take non-negative integers" >&2; exit 2 ;;
esac

# The test runs target/debug/nokv-server, so the binaries must be current.
cargo build --workspace --bins --quiet
cargo test -p nokv-tests --test chaos --no-run --quiet
cargo test -p nokv-tests --test failover --no-run --quiet

logs=$(mktemp -d "${TMPDIR:-/tmp}/nokv-chaos.XXXXXX")
passed=0
failed=0
for ((s = seed; s < seed + runs; s++)); do
    if NOKV_CHAOS_SEED=$s NOKV_CHAOS_RUNS=1 \
        cargo test -p nokv-tests --test chaos --quiet -- acknowledged_writes --nocapture >"$logs/$s.log" 2>&1; then
        passed=$((passed + 1))
        rm -f "$logs/$s.log"
    else
        failed=$((failed + 1))
        reason=$(grep -m1 -o 'chaos seed [0-9]* failed: .*' "$logs/$s.log" | cut -c1-200 || true)
        echo "FAILED seed $s: ${reason:-see log} (log $logs/$s.log; replay: NOKV_CHAOS_SEED=$s NOKV_CHAOS_RUNS=1 cargo test -p nokv-tests --test chaos -- acknowledged_writes --nocapture)"
    fi
done
# Provider durability: crash failover under provider faults.
for ((s = seed; s < seed + runs; s++)); do
    if NOKV_CHAOS_SEED=$s \
        cargo test -p nokv-tests --test failover --quiet -- a_killed_and_wiped --nocapture >"$logs/p$s.log" 2>&1; then
        passed=$((passed + 1))
        rm -f "$logs/p$s.log"
    else
        failed=$((failed + 1))
        reason=$(grep -m1 -A1 'panicked' "$logs/p$s.log" | tail -1 | cut -c1-200 || true)
        echo "FAILED provider seed $s: ${reason:-see log} (log $logs/p$s.log; replay: NOKV_CHAOS_SEED=$s cargo test -p nokv-tests --test failover -- a_killed_and_wiped --nocapture)"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
