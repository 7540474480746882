"""The Python package as its users install it (doc/building.md, "pip install"): a copy of the
source tree's files (what git tracks, and new files it does not ignore), `pip install
--no-build-isolation --no-index '.[torch]'` into a fresh `python3 -m venv
--system-site-packages` (pyproject.toml, meson-python, meson's wheel option), then, from
another folder, package_check.py in a world of 2 ranks run by the venv's Python: the import,
the versions, the allreduce, and libtfab mapped from the venv. Every wait is bounded; the venv
and the copy are removed at the end.
  package.py SOURCE_ROOT MESON_VERSION     (run by /usr/bin/python3, which has meson-python)
Exits 77 (skip) without git, meson-python or venv's pip (python3-mesonpy, python3-venv)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testprocs import finish, free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PIP_WAIT_S = 900  # the build compiles the whole library: a few minutes on two cores
WORLD_WAIT_S = 120


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def run(argv, log, wait_s, **kw):
    """Runs argv with its output in the file log; a failure or overrun ends the test with the
    log's tail."""
    start = time.monotonic()
    with open(log, "w") as out:
        # A group of its own: pip's build (meson, ninja, the compilers) ends with it.
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, **kw)
        try:
            rc = p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            rc = "killed after %d s" % wait_s
        finally:
            if p.returncode is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    took = time.monotonic() - start
    print("%s: %s s (%s)" % (" ".join(os.path.basename(a) for a in argv[:4]), round(took),
                              "ok" if rc == 0 else rc))
    if rc != 0:
        with open(log) as f:
            print("".join(f.readlines()[-60:]))
        sys.exit(1)


def copy_tree(src, dest):
    """The files git would commit: tracked ones as they are now, and new ones not ignored (no
    build folders, no meson-python leftovers)."""
    try:
        names = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", src, "ls-files", "-z", "--cached",
             "--others", "--exclude-standard"],
            check=True, capture_output=True, timeout=60).stdout.decode().split("\0")
    except FileNotFoundError:
        skip("git not found: the copy of the source tree takes its files from git")
    except subprocess.CalledProcessError as e:
        skip("%s is not a git checkout (%s)" % (src, e.stderr.decode().strip()))
    copied = 0
    for name in filter(None, names):
        s = os.path.join(src, name)
        if not os.path.lexists(s):  # deleted, not yet committed
            continue
        d = os.path.join(dest, name)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d, follow_symlinks=False)
        copied += 1
    print("copied %d files of %s" % (copied, src))


def main():
    # meson test's timeout (SIGTERM) still removes the venv and the copy.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("SIGTERM"))
    src, meson_version = os.path.abspath(sys.argv[1]), sys.argv[2]
    py = sys.executable
    probe = subprocess.run([py, "-c", "import mesonpy, ensurepip, venv"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode:
        skip("%s lacks meson-python or venv with pip (Debian: python3-mesonpy, python3-venv): %s"
             % (py, probe.stderr.strip().splitlines()[-1:]))
    tmp = tempfile.mkdtemp(prefix="tfab-package-")
    try:
        copy = os.path.join(tmp, "src")
        venv = os.path.join(tmp, "venv")
        elsewhere = os.path.join(tmp, "elsewhere")
        os.makedirs(elsewhere)
        copy_tree(src, copy)
        # Nothing of the build tree or of the caller's Python settings; pip offline.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "PIP_", "TFAB_", "MESON"))
               and k != "LD_LIBRARY_PATH"}
        env.update({"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
                    "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
        run([py, "-m", "venv", "--system-site-packages", venv], os.path.join(tmp, "venv.log"),
            120, env=env)
        vpy = os.path.join(venv, "bin", "python")
        run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index",
             "--no-cache-dir", ".[torch]"], os.path.join(tmp, "pip.log"), PIP_WAIT_S,
            env=env, cwd=copy)
        # Every module of the source's package is in the installed one (meson's py_sources).
        top = os.path.join(src, "lib", "python", "tfab")
        modules = sorted(os.path.relpath(os.path.join(d, f), top)
                         for d, _, files in os.walk(top) for f in files
                         if f.endswith((".py", ".pyi")))
        port = free_port()
        procs = []
        for rank in range(2):
            renv = dict(env, TFAB_PROVIDER="shm", TFAB_RANK=str(rank), TFAB_WORLD_SIZE="2",
                        TFAB_MASTER_ADDR="127.0.0.1", TFAB_MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [vpy, "-I", os.path.join(HERE, "package_check.py"), venv, meson_version,
                 ",".join(modules)],
                cwd=elsewhere, env=renv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        try:
            results = finish(procs, WORLD_WAIT_S)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = False
        for rank, (rc, out) in enumerate(results):
            print("rank %d (exit %s):\n%s" % (rank, rc, out.rstrip()))
            failed |= rc != 0
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
