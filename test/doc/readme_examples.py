#!/usr/bin/env python3
"""The README's examples are files that the tests compile and run: each fenced block that
follows a line `<!-- doc/examples/NAME -->` must be that file, byte for byte. Fails, naming the
file and the first line that differs, when one was edited without the other; fails too when
the README shows no C or no Python example this way.

usage: readme_examples.py SOURCE_ROOT
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
marker = re.compile(r"^<!-- (doc/examples/[\w.-]+) -->\n```(\w+)\n(.*?)^```$", re.M | re.S)
failed = False
langs = set()
for m in marker.finditer(readme):
    name, lang, shown = m.group(1), m.group(2), m.group(3)
    langs.add(lang)
    path = root / name
    if not path.is_file():
        print(f"README.md shows {name}, which does not exist")
        failed = True
        continue
    real = path.read_text()
    if shown != real:
        a, b = shown.splitlines(), real.splitlines()
        line = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"README.md's copy of {name} differs from the file at line {line + 1}:")
        print(f"  README: {a[line] if line < len(a) else '(ends)'}")
        print(f"  file:   {b[line] if line < len(b) else '(ends)'}")
        failed = True
    else:
        print(f"{name}: the README shows it as it is")
for lang in ("c", "python"):
    if lang not in langs:
        print(f"README.md shows no {lang} example from doc/examples/")
        failed = True
sys.exit(1 if failed else 0)
