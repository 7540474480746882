#!/usr/bin/env python3
"""Every public declaration has a Doxygen comment.

usage: doxygen_undocumented.py DOXYFILE INCLUDE_DIR

Runs doxygen with the API reference's Doxyfile (doc/Doxyfile.in), writing XML instead of
HTML into a scratch folder, and fails, printing each, on:
 - any warning doxygen gives: a function, type, macro or struct field left without a
   comment, or a comment doxygen cannot read;
 - an enum value or macro without a comment, which doxygen does not warn about itself
   (found in its XML);
 - a header in INCLUDE_DIR without a @file comment: doxygen documents nothing of a file
   that has none, and so warns about nothing in it either.
Skips (77) when doxygen is not installed (Debian: doxygen).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def text(elem):
    return "".join(elem.itertext()).strip() if elem is not None else ""


def documented(elem):
    return bool(text(elem.find("briefdescription")) or text(elem.find("detaileddescription")))


def where(elem):
    loc = elem.find("location")
    if loc is None:
        return "?"
    return "%s:%s" % (loc.get("file"), loc.get("line"))


def xml_problems(xml_dir, headers):
    problems = []
    files = {}
    for name in sorted(os.listdir(xml_dir)):
        if not name.endswith(".xml") or name in ("index.xml", "Doxyfile.xml"):
            continue
        root = ET.parse(os.path.join(xml_dir, name)).getroot()
        for compound in root.iter("compounddef"):
            if compound.get("kind") == "file":
                files[text(compound.find("compoundname"))] = compound
            for member in compound.iter("memberdef"):
                kind = member.get("kind")
                mname = text(member.find("name"))
                if kind == "define" and not documented(member):
                    problems.append("%s: macro %s is not documented" % (where(member), mname))
                if kind != "enum":
                    continue
                for value in member.findall("enumvalue"):
                    if not documented(value):
                        problems.append("%s: enum value %s (of %s) is not documented"
                                        % (where(member), text(value.find("name")),
                                           mname if not mname.startswith("@") else
                                           "an anonymous enum"))
    for header in headers:
        compound = files.get(header)
        if compound is None or not documented(compound):
            problems.append("%s: no /** @file */ comment, so nothing in it is documented"
                            % header)
    # The same enum or macro is listed by its file and by the groups it is in.
    return sorted(set(problems))


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    doxyfile, include_dir = sys.argv[1], sys.argv[2]
    doxygen = shutil.which("doxygen")
    if not doxygen:
        print("SKIP: doxygen is not installed (Debian: doxygen)")
        return 77
    headers = sorted(h for h in os.listdir(include_dir) if h.endswith(".h"))
    with tempfile.TemporaryDirectory(prefix="tfab-doxygen-") as out:
        log = os.path.join(out, "warnings.log")
        with open(doxyfile) as f:
            config = f.read()
        # Later settings win over the Doxyfile's.
        config += "\n".join([
            "",
            'OUTPUT_DIRECTORY = "%s"' % out,
            'WARN_LOGFILE = "%s"' % log,
            "GENERATE_HTML = NO",
            "GENERATE_XML = YES",
            "XML_PROGRAMLISTING = NO",
            "",
        ])
        run = subprocess.run([doxygen, "-"], input=config, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if run.returncode != 0:
            print(run.stdout, end="")
            print("doxygen failed (exit status %d)" % run.returncode)
            return 1
        with open(log) as f:
            warnings = [line.rstrip("\n") for line in f if line.strip()]
        # Anything doxygen says on its own output, despite QUIET, is a warning too.
        warnings += [line for line in run.stdout.splitlines() if line.strip()]
        problems = warnings + xml_problems(os.path.join(out, "xml"), headers)
    for p in problems:
        print(p)
    if problems:
        print("%d problem%s in the public headers' Doxygen comments"
              % (len(problems), "" if len(problems) == 1 else "s"))
        return 1
    print("every public declaration in %d headers is documented" % len(headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
