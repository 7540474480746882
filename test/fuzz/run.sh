#!/usr/bin/env bash
# run.sh FUZZER CORPUS: fuzz for TFAB_FUZZ_SECONDS (30) from the seed corpus, new inputs in a
# scratch directory that goes away; a crash's input is kept in build/fuzz-crashes/ and fails
# the test. Ends with the executions and the coverage reached (libFuzzer's last stats line).
set -u
fuzzer=$1
corpus=$2
secs=${TFAB_FUZZ_SECONDS:-30}
name=$(basename "$fuzzer")
work=$(mktemp -d)
crashes=${MESON_BUILD_ROOT:-$PWD}/fuzz-crashes/$name
mkdir -p "$crashes"
trap 'rm -rf "$work"' EXIT
log=$work/log
"$fuzzer" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=8192 \
	-print_final_stats=1 -artifact_prefix="$crashes/" "$work" "$corpus" >"$log" 2>&1
rc=$?
tail -n 40 "$log"
stats=$(grep -E '^#[0-9]+.*(DONE|cov:)' "$log" | tail -n 1)
echo "$name: ${secs}s, exit $rc: ${stats:-no stats line}"
exit $rc
