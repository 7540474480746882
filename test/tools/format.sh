#!/usr/bin/env bash
# The C sources (the examples in doc/examples too) pass the committed .clang-format.
# usage: format.sh SOURCE_ROOT
cd "$1" || exit 1
if ! command -v clang-format >/dev/null; then
	echo "SKIP: clang-format is not installed"
	exit 77
fi
bad=0
while IFS= read -r f; do
	if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
		echo "not formatted: $f (clang-format -i $f)"
		bad=1
	fi
done < <(find include lib providers test tools doc/examples -name '*.[ch]' | sort)
exit $bad
