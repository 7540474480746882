"""One rank of package.py's world of 2, run by the venv's Python (-I: neither this folder nor
PYTHONPATH on sys.path) from a folder outside the source and the venv, joining from the
TFAB_* environment that package.py sets: the package and its library come from the venv, the
versions agree, the distribution holds only the package, and an allreduce sums.
  package_check.py VENV MESON_VERSION MODULE,MODULE,...   (the .py and .pyi files of the
  source's package)"""
import importlib.metadata
import os
import sys

import numpy as np

import tfab

venv = os.path.realpath(sys.argv[1])
meson_version = sys.argv[2]
modules = sys.argv[3].split(",")
rank = int(os.environ["TFAB_RANK"])
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


pkg = os.path.dirname(os.path.realpath(tfab.__file__))
check(os.path.realpath(sys.prefix) == venv, "sys.prefix %s is not the venv" % sys.prefix)
check(pkg.startswith(venv + os.sep), "tfab imported from %s" % pkg)
check(os.path.dirname(os.path.realpath(tfab._tfab.__file__)) == pkg,
      "tfab._tfab is %s" % tfab._tfab.__file__)

dist_version = importlib.metadata.version("tfab")
versions = [tfab.__version__, tfab.version(), meson_version, dist_version]
check(len(set(versions)) == 1,
      "versions differ: __version__ %s, version() %s, meson.build %s, the distribution %s"
      % tuple(versions))

missing = [m for m in modules if not os.path.isfile(os.path.join(pkg, m))]
check(not missing, "modules of the source not installed: %s (lib/python/tfab/meson.build's "
      "py_sources lists what a wheel holds)" % missing)
check(os.path.isfile(os.path.join(pkg, "libtfab.so")), "no libtfab.so in %s" % pkg)
# The wheel holds the package and its metadata, nothing meson-python had to relocate.
stray = [str(f) for f in importlib.metadata.files("tfab")
         if f.parts[0] != "tfab" and not f.parts[0].endswith(".dist-info")]
check(not stray, "files outside the package: %s" % stray)

# libtfab as the loader found it through _tfab's rpath: the venv's, and no other.
with open("/proc/self/maps") as f:
    mapped = {line.split()[-1] for line in f if "libtfab" in line.rsplit("/", 1)[-1]}
check(mapped == {os.path.join(pkg, "libtfab.so")}, "libtfab mapped from %s" % sorted(mapped))

with tfab.World(timeout=60) as w:
    a = np.full(1000, rank + 1, dtype=np.float32)
    w.allreduce(a).result(timeout=60)
    check((w.rank, w.size) == (rank, 2), "rank %d of %d" % (w.rank, w.size))
    check(bool((a == 3).all()), "allreduce gave %s" % a[:4])

# The torch.distributed backend, where torch is (Debian's, through --system-site-packages).
try:
    import torch.distributed
except ImportError:
    torch = None
if torch is not None:
    import tfab.torch
    check(os.path.dirname(os.path.realpath(tfab.torch.__file__)) == os.path.join(pkg, "torch"),
          "tfab.torch is %s" % tfab.torch.__file__)
    check("TFAB" in torch.distributed.Backend._plugins, "tfab.torch registered no backend")

if problems:
    print("rank %d:\n  %s" % (rank, "\n  ".join(problems)))
    sys.exit(1)
print("rank %d: tfab %s from %s, libtfab mapped from there, allreduce ok" % (rank,
      tfab.__version__, pkg))
