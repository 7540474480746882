#!/usr/bin/env bash
# Builds doc/examples/pair.c as a user of tfab would, with the compiler and pkg-config alone,
# and runs it (run.py pair).
#   pkgconfig.sh installed BUILD_ROOT SOURCE_ROOT CC
#       against a copy that `meson install --destdir` puts in a temporary folder (tfab.pc)
#   pkgconfig.sh uninstalled BUILD_ROOT SOURCE_ROOT CC
#       against the build tree itself (meson-uninstalled/tfab-uninstalled.pc)
# Its temporary folder goes, however it ends.
set -euo pipefail
mode=$1 build=$2 src=$3 cc=$4
here=$(cd "$(dirname "$0")" && pwd)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case $mode in
installed)
	command -v meson >/dev/null || { echo "SKIP: meson is not on PATH"; exit 77; }
	meson install -C "$build" --destdir "$tmp/stage" --no-rebuild --quiet >"$tmp/install.log" ||
		{ cat "$tmp/install.log"; exit 1; }
	pc=$(find "$tmp/stage" -name tfab.pc)
	[ -n "$pc" ] || { echo "meson install put no tfab.pc in $tmp/stage"; exit 1; }
	PKG_CONFIG_PATH=$(dirname "$pc")
	export PKG_CONFIG_PATH
	# The .pc file names the final prefix (/usr/local): point it at the staged copy.
	prefix=$(pkg-config --variable=prefix tfab)
	pkgconfig=(pkg-config --define-variable=prefix="$tmp/stage$prefix")
	libdir=$("${pkgconfig[@]}" --variable=libdir tfab)
	;;
uninstalled)
	export PKG_CONFIG_PATH=$build/meson-uninstalled
	pkgconfig=(pkg-config)
	libdir=$build
	;;
*)
	echo "usage: pkgconfig.sh installed|uninstalled BUILD_ROOT SOURCE_ROOT CC"
	exit 2
	;;
esac

flags=$("${pkgconfig[@]}" --cflags --libs tfab)
echo "pkg-config --cflags --libs tfab: $flags"
# shellcheck disable=SC2086 # flags are words
"$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/pair" "$src/doc/examples/pair.c" $flags
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Against this library, not one installed elsewhere on the system.
ldd "$tmp/pair" | grep -F "$libdir/libtfab.so" ||
	{ echo "pair does not load libtfab from $libdir"; ldd "$tmp/pair"; exit 1; }
python3 "$here/run.py" pair "$tmp/pair"
