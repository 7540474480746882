#!/usr/bin/env python3
"""Runs one command on real kernel verbs: soft-RoCE (rdma_rxe) inside a throw-away QEMU VM.

    vm.py --cache DIR prepare
    vm.py --cache DIR run [--name NAME] [--timeout S] [--cwd DIR] [--env K=V]... [--need PROG]...
                          -- COMMAND [ARG]...

prepare (also done by run, once) fetches the kernel package that linux-image-amd64 depends on
into a scratch folder (never installed on this host), and keeps under DIR/kernel/ an
uncompressed vmlinux (booted directly, PVH) and an initramfs: busybox-static, the kernel
modules for rdma_rxe, rdma_ucm, dummy and a virtio 9p share, and guest-init.sh. It is
idempotent and safe to run from several processes at once (flock on DIR/prepare.lock).
TFAB_VM_KERNEL_DEB=FILE.deb uses that kernel package instead of downloading one.

run boots the VM with this machine's root filesystem shared read-only over 9p. The guest's init
mounts it, mounts proc, sys, dev and tmpfs (/tmp, /run, /dev/shm) over it, and chroots into it,
so every program, library and the meson build dir are at the same paths as here. It adds rxe0 on
dummy0 (10.93.0.1; GID index 1 is ::ffff:10.93.0.1), runs COMMAND in the given directory with
only the given environment (and TFAB_VM_EXTRA_ENV="NAME=VALUE ..." from here), and reports its
exit status on the serial console; this script exits with it (77 is SKIP). DIR/runs/NAME/ keeps
the console log, the command's stdout and stderr and the job script of the latest run of NAME;
the command finds that folder, the only place it can write that outlives the VM, in
$TFAB_VM_RUN_DIR.

Exits 77 with a one-line reason when this machine cannot run the VM (no qemu, no busybox-static,
no kernel package to download...). See doc/verbs-vm.md.
"""

import argparse
import ctypes
import fcntl
import lzma
import os
import re
import select
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
QEMU = "qemu-system-x86_64"
# A failed prepare is remembered for this long, so that a suite without network skips fast.
FAILED_PREPARE_TTL_S = 600
# Seconds qemu gets to exit after the guest has reported its exit status.
POWEROFF_GRACE_S = 15
# Modules to load in the guest, with their dependencies in front of each; crc32_generic first,
# as rdma_rxe needs it and nothing declares it.
MODULES = ["crc32_generic", "rdma_rxe", "rdma_ucm", "dummy", "virtio_pci", "9pnet_virtio", "9p",
           # the fault suite's hosts (veth pairs on a bridge) and its netem cases
           "veth", "bridge", "sch_netem"]
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host variables passed on to the guest when set (meson sets MALLOC_PERTURB_).
PASSED_ENV = ["MALLOC_PERTURB_"]


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def log(msg):
    print(f"tfab-vm: {msg}", file=sys.stderr, flush=True)


def run_quiet(cmd, timeout, what, exc=None, **kw):
    """Runs cmd, returns its stdout; raises exc (Skip by default) with what and its last output
    line on failure."""
    exc = exc or Skip
    cmd = [shutil.which(cmd[0], path=GUEST_PATH) or cmd[0]] + cmd[1:]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise exc(f"{what}: no answer within {timeout} s")
    except OSError as e:
        raise exc(f"{what}: {e}")
    if p.returncode != 0:
        last = [l for l in p.stdout.splitlines() if l.strip()][-1:] or ["(no output)"]
        raise exc(f"{what}: {last[0].strip()}")
    return p.stdout


def is_static_elf(path):
    """True when path is an ELF file without a program interpreter (statically linked)."""
    with open(path, "rb") as f:
        h = f.read(64)
        if h[:4] != b"\x7fELF" or h[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", h, 32)
        phentsize, phnum = struct.unpack_from("<HH", h, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            if struct.unpack("<I", f.read(4))[0] == 3:  # PT_INTERP
                return False
    return True


def cpio_newc(entries):
    """An uncompressed newc archive of (name, mode, data, rdev) entries."""
    out = bytearray()

    def add(name, mode, data=b"", rdev=(0, 0), ino=0):
        nameb = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(nameb), 0]
        out.extend(b"070701" + b"".join(b"%08x" % v for v in fields) + nameb)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for i, (name, mode, data, rdev) in enumerate(entries, 1):
        add(name, mode, data, rdev, i)
    add("TRAILER!!!", 0)
    return bytes(out)


def extract_vmlinux(vmlinuz):
    """The uncompressed ELF kernel inside a bzImage's XZ stream (PVH boot skips ~4 s of
    decompression under TCG); None when there is no such stream."""
    data = open(vmlinuz, "rb").read()
    start = data.find(b"\xfd7zXZ\x00")
    while start >= 0:
        try:
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
            if out[:4] == b"\x7fELF":
                return out
        except lzma.LZMAError:
            pass
        start = data.find(b"\xfd7zXZ\x00", start + 1)
    return None


def kernel_package():
    """The kernel image package that linux-image-amd64 depends on, from the apt lists."""
    out = run_quiet(["apt-cache", "depends", "linux-image-amd64"], 60,
                    "apt-cache depends linux-image-amd64")
    m = re.search(r"Depends:\s*(linux-image-\S+)", out)
    if not m:
        raise Skip("apt-cache: linux-image-amd64 names no kernel package (run apt-get update)")
    return m.group(1)


def check_tools():
    for tool in ("apt-cache", "apt-get", "dpkg-deb", "depmod", "modprobe"):
        if not shutil.which(tool, path=GUEST_PATH):
            raise Skip(f"{tool} not found (apt-get install kmod)")
    busybox = shutil.which("busybox", path=GUEST_PATH)
    if not busybox or not is_static_elf(busybox):
        raise Skip("no static busybox (apt-get install busybox-static)")
    return busybox


def build_kernel(cache):
    """Fills cache/kernel/ with vmlinux (or vmlinuz), modules/*.ko, modules/order and VERSION."""
    scratch = tempfile.mkdtemp(prefix="prepare.", dir=cache)
    try:
        deb = os.environ.get("TFAB_VM_KERNEL_DEB")
        if deb:
            deb = os.path.abspath(deb)
        else:
            pkg = kernel_package()
            log(f"downloading {pkg}")
            run_quiet(["apt-get", "download", "-q", pkg], 600, f"apt-get download {pkg}",
                      cwd=scratch)
            debs = [f for f in os.listdir(scratch) if f.endswith(".deb")]
            if not debs:
                raise Skip(f"apt-get download {pkg}: no .deb")
            deb = os.path.join(scratch, debs[0])
        root = os.path.join(scratch, "root")
        # The package is at hand: a step that goes wrong from here is a failure, not a missing
        # VM (only modules compressed, which the guest's busybox insmod cannot load, skip).
        run_quiet(["dpkg-deb", "-x", deb, root], 300, "dpkg-deb -x", Fail)
        versions = os.listdir(os.path.join(root, "lib", "modules"))
        if len(versions) != 1:
            raise Fail(f"kernel package holds {len(versions)} module trees")
        kver = versions[0]
        run_quiet(["depmod", "-b", root, kver], 120, "depmod", Fail)

        out = os.path.join(scratch, "kernel")
        os.makedirs(os.path.join(out, "modules"))
        order = []
        for mod in MODULES:
            deps = run_quiet(["modprobe", "-d", root, "-S", kver, "--show-depends", mod], 60,
                             f"modprobe --show-depends {mod}", Fail)
            for line in deps.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "insmod":
                    name = os.path.basename(parts[1])
                    if name.endswith((".xz", ".zst", ".gz")):
                        raise Skip(f"compressed kernel modules ({name}) are not supported")
                    if name not in order:
                        order.append(name)
                        shutil.copy(parts[1], os.path.join(out, "modules", name))
        with open(os.path.join(out, "modules", "order"), "w") as f:
            f.write("\n".join(order) + "\n")

        vmlinuz = os.path.join(root, "boot", f"vmlinuz-{kver}")
        vmlinux = extract_vmlinux(vmlinuz)
        if vmlinux:
            with open(os.path.join(out, "vmlinux"), "wb") as f:
                f.write(vmlinux)
        else:
            shutil.copy(vmlinuz, os.path.join(out, "vmlinuz"))
        with open(os.path.join(out, "VERSION"), "w") as f:
            f.write(kver + "\n")
        with open(os.path.join(out, "MODULES"), "w") as f:
            f.write(" ".join(MODULES) + "\n")
        final = os.path.join(cache, "kernel")
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(out, final)
        log(f"kernel {kver} ready in {final}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_initramfs(kernel, busybox):
    """kernel/initramfs.cpio: busybox, guest-init.sh as /init, the modules in load order."""
    d755, f755, f644 = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries = [(d, d755, b"", (0, 0)) for d in
               ("bin", "dev", "proc", "sys", "newroot", "job", "modules")]
    entries.append(("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)))
    entries.append(("bin/busybox", f755, open(busybox, "rb").read(), (0, 0)))
    entries.append(("init", f755, open(os.path.join(HERE, "guest-init.sh"), "rb").read(),
                    (0, 0)))
    mods = os.path.join(kernel, "modules")
    for name in open(os.path.join(mods, "order")).read().split() + ["order"]:
        entries.append(("modules/" + name, f644, open(os.path.join(mods, name), "rb").read(),
                        (0, 0)))
    tmp = os.path.join(kernel, "initramfs.cpio.tmp")
    with open(tmp, "wb") as f:
        f.write(cpio_newc(entries))
    os.rename(tmp, os.path.join(kernel, "initramfs.cpio"))


def prepare(cache, retry=False):
    """Makes sure cache/kernel/ is complete; raises Skip when it cannot be. A failed download
    is remembered for a while (unless retry), so that a suite without network skips fast."""
    busybox = check_tools()
    os.makedirs(cache, exist_ok=True)
    kernel = os.path.join(cache, "kernel")
    failed = os.path.join(cache, "prepare-failed")
    with open(os.path.join(cache, "prepare.lock"), "w") as lock:
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Fail(f"{cache}/prepare.lock held for 15 minutes")
                time.sleep(0.5)
        try:
            have = open(os.path.join(kernel, "MODULES")).read().split()
        except OSError:
            have = None
        if have != MODULES:  # none yet, or another module list: fetch again
            if not retry and os.path.exists(failed) and \
                    time.time() - os.stat(failed).st_mtime < FAILED_PREPARE_TTL_S:
                raise Skip(open(failed).read().strip())
            try:
                build_kernel(cache)
            except Skip as e:
                with open(failed, "w") as f:
                    f.write(f"{e} (remembered for {FAILED_PREPARE_TTL_S} s; "
                            f"vm.py --cache {cache} prepare retries now)\n")
                raise
            if os.path.exists(failed):
                os.unlink(failed)
        # The initramfs holds guest-init.sh and busybox: rebuild it when either changed.
        initramfs = os.path.join(kernel, "initramfs.cpio")
        newest = max(os.stat(os.path.join(HERE, "guest-init.sh")).st_mtime,
                     os.stat(busybox).st_mtime, os.stat(os.path.join(kernel, "VERSION")).st_mtime)
        if not os.path.exists(initramfs) or os.stat(initramfs).st_mtime < newest:
            build_initramfs(kernel, busybox)
        return kernel


def write_job(jobdir, cwd, env, command):
    """The script the guest runs in the chroot, and the file that tells init where it is."""
    lines = ["# Written by test/verbs/vm.py: runs in the VM, chrooted into the host's root.",
             "ulimit -l unlimited", f"cd {shlex.quote(cwd)} || exit 125"]
    env = dict(env, TFAB_VM_RUN_DIR=jobdir)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("exec " + " ".join(shlex.quote(c) for c in command))
    with open(os.path.join(jobdir, "job.sh"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(jobdir, "path"), "w") as f:
        f.write(jobdir + "\n")
    for name in ("stdout", "stderr", "console.log"):
        path = os.path.join(jobdir, name)
        if os.path.exists(path):
            os.unlink(path)


def die_with_parent():
    # qemu gets SIGKILL if this script dies, even by SIGKILL.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def boot(kernel, jobdir, mem, smp, timeout, verbose):
    """Boots, waits for the exit marker; returns (status, seconds to ready, seconds total)."""
    image = os.path.join(kernel, "vmlinux")
    if not os.path.exists(image):
        image = os.path.join(kernel, "vmlinuz")
    cmd = [QEMU, "-machine", "q35,accel=tcg", "-cpu", "max", "-m", str(mem), "-smp", str(smp),
           "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
           "-serial", "stdio",
           "-kernel", image, "-initrd", os.path.join(kernel, "initramfs.cpio"),
           "-append", "console=ttyS0 quiet panic=-1 oops=panic",
           "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,"
                      "multidevs=remap",
           "-virtfs", f"local,path={jobdir},mount_tag=job,security_model=none"]
    console_path = os.path.join(jobdir, "console.log")
    console = open(console_path, "wb")
    console.write(("# " + " ".join(shlex.quote(c) for c in cmd) + "\n").encode())
    console.flush()
    t0 = time.monotonic()
    deadline = t0 + timeout
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    status = setup_failed = None
    ready = None
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and status is not None:
                log(f"qemu still running {POWEROFF_GRACE_S} s after the guest's exit status; "
                    "killed")
                break
            if left <= 0:
                raise Fail(f"timed out after {timeout} s (boot + run); "
                           f"console log: {console_path}")
            r, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            console.write(chunk)
            console.flush()
            if verbose:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                line = line.decode(errors="replace").strip()
                if line == "TFAB-VM-READY" and ready is None:
                    ready = time.monotonic() - t0
                m = re.match(r"TFAB-VM-EXIT: (\d+)$", line)
                if m and status is None:
                    status = int(m.group(1))
                    deadline = min(deadline, time.monotonic() + POWEROFF_GRACE_S)
                m = re.match(r"TFAB-VM-SETUP-FAILED: (.*)$", line)
                if m:
                    setup_failed = m.group(1)
        try:
            proc.wait(timeout=5)  # its output ended: it is on its way out
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        console.close()
    if setup_failed:
        raise Fail(f"guest setup failed: {setup_failed}; console log: {console_path}")
    if status is None:
        raise Fail(f"qemu exited ({proc.returncode}) without the guest's exit status; "
                   f"console log: {console_path}")
    return status, ready, time.monotonic() - t0


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def relay(jobdir):
    """Copies the command's stdout and stderr (files on the job share) to ours."""
    for name, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        try:
            with open(os.path.join(jobdir, name), "rb") as f:
                shutil.copyfileobj(f, out.buffer)
        except FileNotFoundError:
            pass
        out.flush()


def cmd_run(args):
    if not shutil.which(QEMU):
        raise Skip(f"{QEMU} not found (apt-get install qemu-system-x86)")
    for prog in ["rdma"] + args.need:
        if not shutil.which(prog, path=GUEST_PATH):
            raise Skip(f"{prog} not found on this machine (the guest uses this machine's "
                       "programs)")
    if not args.command:
        raise Fail("no command given")
    if not os.access("/dev/null", os.W_OK):
        raise Skip("/dev/null is not usable here")
    kernel = prepare(args.cache)

    env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    extra = shlex.split(os.environ.get("TFAB_VM_EXTRA_ENV", ""))
    for kv in args.env + extra:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise Fail(f"--env wants NAME=VALUE, not {kv!r}")
        env[k] = v

    jobdir = os.path.join(args.cache, "runs", args.name)
    os.makedirs(jobdir, exist_ok=True)
    with open(os.path.join(jobdir, "lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Fail(f"a run named {args.name} is in progress (give another --name)")
        write_job(jobdir, os.path.abspath(args.cwd), env, args.command)
        try:
            status, ready, total = boot(kernel, jobdir, args.mem, args.smp, args.timeout,
                                        args.verbose)
        except Fail:
            relay(jobdir)
            for line in tail(os.path.join(jobdir, "console.log"), 20):
                print(f"tfab-vm console| {line}", file=sys.stderr)
            raise
        relay(jobdir)
    if status not in (0, SKIP):  # the guest's side of a failure, for a log that has no more
        for line in tail(os.path.join(jobdir, "console.log"), 20):
            print(f"tfab-vm console| {line}", file=sys.stderr)
    log(f"exit status {status}; VM ready after {ready or 0:.1f} s, "
        f"{total:.1f} s in all; logs in {jobdir}")
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="folder for the kernel and the run logs")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare", help="fetch the kernel and build the initramfs")
    r = sub.add_parser("run", help="run a command in the VM")
    r.add_argument("--name", default="manual", help="run folder under CACHE/runs/")
    r.add_argument("--timeout", type=float, default=300, help="seconds for boot + run")
    r.add_argument("--cwd", default=os.getcwd(), help="directory to run in (this one)")
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    r.add_argument("--need", action="append", default=[], metavar="PROGRAM",
                   help="skip unless PROGRAM is installed")
    r.add_argument("--mem", type=int, default=2048, help="guest memory, MiB")
    r.add_argument("--smp", type=int, default=2, help="guest CPUs")
    r.add_argument("-v", "--verbose", action="store_true", help="show the console")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    args.cache = os.path.abspath(args.cache)
    if args.what == "run" and args.command[:1] == ["--"]:
        args.command = args.command[1:]

    # meson's timeout sends SIGTERM to the process group: unwind (qemu is killed in boot()).
    def on_signal(signum, frame):
        raise Fail(f"stopped by signal {signum}")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        if args.what == "prepare":
            print(prepare(args.cache, retry=True))
            return 0
        return cmd_run(args)
    except Skip as e:
        print(f"SKIP: {e}", flush=True)
        return SKIP
    except Fail as e:
        log(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
