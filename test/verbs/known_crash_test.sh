#!/usr/bin/env bash
# known_crash.sh's rule, on fake runs: a SKIP (77) only where every failed test crashed at the
# known libfabric frame and nothing else went wrong; the run's own status otherwise.
# usage: known_crash_test.sh PATH/TO/known_crash.sh
set -u
known_crash=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

# Output as test_engine under cmocka gives it: "ok NAME", "crash0 NAME" (rank 0's crash at the
# known frame), "crash1 NAME" (rank 1's, reported by libpsm2, with a rank's line in between),
# "other NAME" (rank 1 dies elsewhere in libfabric), "fail NAME" (a check fails), "failcrash
# NAME" (a check fails, then the crash), "run NAME" (started, never ended), "end" (the summary).
fake() { # name, exit status, steps...
	local name=$1 status=$2
	shift 2
	{
		echo '#!/usr/bin/env bash'
		echo 'echo "[==========] Running 3 test(s)."'
		for step in "$@"; do
			local what=${step%% *} t=${step#* }
			case $what in
			run | ok | crash0 | crash1 | other | fail | failcrash)
				echo "echo '[ RUN      ] $t'"
				;;
			esac
			case $what in
			ok)
				echo "echo '[       OK ] $t'"
				;;
			crash0)
				cat <<-EOF
					echo 'rank 0 terminated with signal 11' >&2
					echo 'Backtrace:' >&2
					echo './test_engine(+0x1c2b3)[0x55d0c1a2b2b3]' >&2
					echo '/lib/x86_64-linux-gnu/libc.so.6(+0x3bfd0)[0x7f3e1c05bfd0]' >&2
					echo '/lib/x86_64-linux-gnu/libfabric.so.1(+0xb7882)[0x7f3e1b8b7882]' >&2
					echo 'Test failed with exception: Segmentation fault(11)' >&2
					echo '[  FAILED  ] $t'
				EOF
				;;
			crash1 | failcrash)
				[ "$what" = crash1 ] || echo "echo 'rank 1: scenario $t failed' >&2"
				cat <<-EOF
					echo 'test_engine:141 terminated with signal 11 at PC=7f3e1b8b7882 SP=7ffd2c1e3a40.  Backtrace:' >&2
					echo '/lib/x86_64-linux-gnu/libpsm2.so.2(+0x15ab0)[0x7f3e1a215ab0]' >&2
					echo 'tfab warn [engine]: peer 1 failed: Peer failed' >&2
					echo '/lib/x86_64-linux-gnu/libc.so.6(+0x3bfd0)[0x7f3e1c05bfd0]' >&2
					echo '/lib/x86_64-linux-gnu/libfabric.so.1(+0xb7882)[0x7f3e1b8b7882]' >&2
					echo 'rank 1 failed (status 0x100)' >&2
					echo '[  ERROR   ] --- 0x1 != 0' >&2
					echo '[  FAILED  ] $t'
				EOF
				;;
			other)
				cat <<-EOF
					echo 'test_engine:141 terminated with signal 11 at PC=7f3e1b87d3be SP=7ffd2c1e3a40.  Backtrace:' >&2
					echo '/lib/x86_64-linux-gnu/libc.so.6(+0x3bfd0)[0x7f3e1c05bfd0]' >&2
					echo '/lib/x86_64-linux-gnu/libfabric.so.1(+0x7d3be)[0x7f3e1b87d3be]' >&2
					echo 'rank 1 failed (status 0x100)' >&2
					echo '[  FAILED  ] $t'
				EOF
				;;
			fail)
				echo "echo 'rank 1: test_engine.c:99: check failed: n == 3' >&2"
				echo "echo 'rank 1: scenario $t failed' >&2"
				echo "echo '[  FAILED  ] $t'"
				;;
			end)
				echo "echo '[==========] 3 test(s) run.'"
				echo "echo '[  PASSED  ] 1 test(s).' >&2"
				;;
			esac
		done
		echo "exit $status"
	} >"$dir/$name"
	chmod +x "$dir/$name"
}

expect() { # what, wanted status, fake's name
	local what=$1 want=$2 got=0
	"$known_crash" "$dir/$3" >"$dir/out" 2>&1 || got=$?
	if [ "$got" = "$want" ]; then
		echo "ok - $what: $got"
	else
		echo "not ok - $what: $got, wanted $want; its output:"
		sed 's/^/    /' "$dir/out"
		fails=$((fails + 1))
	fi
}

fake pass 0 "ok a" "ok b" "end"
expect "a run that passes passes" 0 pass

fake own_skip 77
expect "the command's own skip stands" 77 own_skip

fake only_crash0 1 "ok a" "crash0 b" "ok c" "end"
expect "rank 0's crash at the known frame alone is a skip" 77 only_crash0

fake only_crash1 1 "crash1 a" "ok b" "crash0 c" "end"
expect "known crashes of rank 1 and of rank 0, alone, are a skip" 77 only_crash1

fake crash_and_failure 1 "crash0 a" "fail b" "ok c" "end"
expect "the crash and another test's failure fail" 1 crash_and_failure

fake failure_then_crash 1 "ok a" "failcrash b" "end"
expect "a scenario that failed before the crash fails" 1 failure_then_crash

fake other_crash 1 "ok a" "other b" "end"
expect "a crash elsewhere in libfabric fails" 1 other_crash

fake two_crashes 1 "crash0 a" "other b" "end"
expect "the known crash and another crash fail" 1 two_crashes

fake failure_only 1 "ok a" "fail b" "end"
expect "a failure without a crash fails" 1 failure_only

fake cut_short 1 "ok a" "crash0 b" "run c"
expect "a run that did not end fails" 1 cut_short

fake killed 139 "crash0 a" "end"
expect "a command killed by a signal fails" 139 killed

fake no_failed_test 1 "ok a" "ok b" "end"
expect "a nonzero status with no failed test fails" 1 no_failed_test

[ "$fails" = 0 ] || echo "$fails of the checks failed"
exit $((fails > 0))
