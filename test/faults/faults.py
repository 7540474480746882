#!/usr/bin/env python3
"""The fault suite (doc/faults.md): test hosts made of network namespaces joined by a bridge, and
faults between them, while fault_rank processes trade tensors.

    faults.py FAULT_RANK [CASE[:PATH] ...]

Hosts h0 (the hub), h1 and h2 (spokes) each have one interface, eth0, on a bridge in a switch
namespace; the faults are nftables rules in the switch on h1's port (so neither end's own
stack sees them: a drop there is loss, not an error), netem queues on both ends of h1's link
(delay, reordering, duplication), or signals to h1's process. h2 is the survivor: whatever
happens to h1, its transfers must go on.

Without CASE, every case on every path this machine has; a path it lacks (netem, an RDMA
device) is named with its reason. A CASE or CASE:PATH named on the command line must run here.

Each case asserts: every transfer completed with its data intact or failed with a named status;
no failure took longer to surface than TFAB_OP_TIMEOUT_MS plus TFAB_HEARTBEAT_MS (plus the
slack below) after its fault began, or after its post where that came later; nothing stayed
pending longer than that; the survivor completed transfers throughout; no process, namespace
or shared-memory object is left behind. It prints, per case, transfers completed, failed (by
status), and the longest time a failure took to surface.

TFAB_FAULTS_LOG_LEVEL sets the ranks' TFAB_LOG_LEVEL (warn); TFAB_FAULTS_KEEP=DIR keeps every
rank's whole output there, a file per case, path and host, headed by the case's times.

Needs root and iproute2 with nftables; where namespaces cannot be made it exits 77 and says why.
The netem cases need sch_netem, which this host's kernel lacks, and the verbs paths an RDMA
device: both run in the verbs suite's VM (test faults-vm, doc/faults.md).
"""
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

DEADLINE_MS = 3000
HEARTBEAT_MS = 500
# Scheduling on a loaded two-core machine, the 50 ms liveness period, the coarse clock; more
# in the verbs suite's VM, whose CPUs are emulated (TFAB_FAULTS_SLACK_MS).
SLACK_MS = int(os.environ.get("TFAB_FAULTS_SLACK_MS", "700"))
BOUND_MS = DEADLINE_MS + HEARTBEAT_MS + SLACK_MS
PORT = 17321  # the hub's, in its own namespace; a local path's hub takes a free one (free_port)
TAG = "tf%d" % os.getpid()
NS = {h: "%s-%s" % (TAG, h) for h in ("sw", "h0", "h1", "h2")}
ADDR = {"h0": "10.77.0.1", "h1": "10.77.0.2", "h2": "10.77.0.3"}
MIB = 1 << 20

NET = ["ofi:tcp", "ofi:sockets"]
# Paths whose processes run on this host outside the namespaces. Shared memory needs both ends
# on one host (each `ip netns exec` makes a mount namespace of its own, which tfab counts as
# another host); verbs needs the RDMA device, which stays in the first namespace.
LOCAL = ("shm", "verbs", "ofi:verbs")
# The verbs suite's VM names its soft-RoCE device's address (rxe0 on dummy0) here.
RDMA_ADDR = os.environ.get("TFAB_FAULTS_RDMA_ADDR", "")

# name: (paths, h1's tensor bytes, run seconds, fault, fault start s, fault length s)
CASES = {
    "loss-1pct": (NET, MIB, 6, ("loss", 1), 0.5, 5),
    "loss-10pct": (NET, MIB, 8, ("loss", 10), 0.5, 7),
    "partition": (NET, MIB, 14, ("drop", 100), 2, 6),
    "kill": (["shm"] + NET + ["verbs", "ofi:verbs"], 256 * MIB, 8, ("signal", "KILL"), 2.5, 0),
    "stop": (["shm"] + NET + ["verbs", "ofi:verbs"], 256 * MIB, 12, ("signal", "STOP"), 2.5, 6),
    # netem on both ends of h1's link: each direction delayed (with jitter, which reorders),
    # reordered, or duplicated
    "delay-5ms": (NET, MIB, 5, ("netem", "delay 5ms"), 0.5, 4),
    "delay-50ms": (NET, MIB, 6, ("netem", "delay 50ms 10ms"), 0.5, 5),
    "reorder": (NET, MIB, 5, ("netem", "delay 10ms reorder 25% 50%"), 0.5, 4),
    "duplicate": (NET, MIB, 5, ("netem", "duplicate 10%"), 0.5, 4),
}

# Cases that run only when named on the command line, with the reason. libfabric's sockets
# provider (deprecated upstream for tcp) stalls the hub once a stopped spoke resumes and
# connects again: progress calls of 1.4 to 4.4 s, then a refused write to the survivor
# (FI_ENOENT). Seen in 2 of about 20 runs beside stress-ng --cpu 2, never on tcp (doc/faults.md).
BY_NAME_ONLY = {
    ("stop", "ofi:sockets"): "libfabric's sockets provider stalls the hub when a stopped peer "
                             "resumes (doc/faults.md)",
}


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def nsexec(ns, *args, check=True):
    return sh("ip", "netns", "exec", ns, *args, check=check)


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def stale_hosts_down():
    """Namespaces an earlier run left (a driver killed outright) go, if their driver is gone."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(tf(\d+))-(sw|h\d)\b", line)
        if m and not os.path.exists("/proc/" + m.group(2)):
            sh("ip", "netns", "del", m.group(0), check=False)


def hosts_up():
    for ns in NS.values():
        sh("ip", "netns", "add", ns)
    sw = NS["sw"]
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for h in ("h0", "h1", "h2"):
        ns, port = NS[h], "p-" + h
        sh("ip", "link", "add", TAG + h, "type", "veth", "peer", "name", TAG + "s" + h)
        sh("ip", "link", "set", TAG + h, "netns", ns)
        sh("ip", "link", "set", TAG + "s" + h, "netns", sw)
        sh("ip", "-n", ns, "link", "set", TAG + h, "name", "eth0")
        sh("ip", "-n", sw, "link", "set", TAG + "s" + h, "name", port)
        sh("ip", "-n", sw, "link", "set", port, "master", "br0")
        sh("ip", "-n", sw, "link", "set", port, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", ADDR[h] + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")



def nft_up():
    global NFT
    nsexec(NS["sw"], "nft", "add table bridge faults")
    nsexec(NS["sw"], "nft", "add chain bridge faults links "
           "{ type filter hook forward priority 0 ; }")
    NFT = True


def hosts_down():
    for ns in NS.values():
        sh("ip", "netns", "del", ns, check=False)


NFT = False  # whether the switch has its nftables chain (hosts_up, when a case needs it)


def netem_links():
    """Both ends of h1's link, each queue on its way out: to h1 on the switch, from h1."""
    return [(NS["sw"], "p-h1"), (NS["h1"], "eth0")]


def fault_on(kind, arg):
    """loss, drop: h1's port on the switch drops arg % of what enters or leaves it; netem:
    both ends of h1's link queue what they send through netem with arg."""
    if kind == "netem":
        for ns, dev in netem_links():
            nsexec(ns, "tc", "qdisc", "add", "dev", dev, "root", "netem", *arg.split())
        return
    for d in ("iifname", "oifname"):
        chance = "numgen random mod 100 < %d " % arg if arg < 100 else ""
        nsexec(NS["sw"], "nft", "add rule bridge faults links %s p-h1 %sdrop" % (d, chance))


def fault_off():
    if NFT:
        nsexec(NS["sw"], "nft", "flush chain bridge faults links")
    for ns, dev in netem_links():
        nsexec(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)


def lacks(name, path):
    """Why this machine cannot run a case on a path, or None."""
    if CASES[name][3][0] == "netem" and not NETEM:
        return "no netem here (%s); it runs in the verbs suite's VM" % NETEM_WHY
    if path in ("verbs", "ofi:verbs") and not RDMA_ADDR:
        return "no RDMA device here (TFAB_FAULTS_RDMA_ADDR); it runs in the verbs suite's VM"
    return None


NETEM, NETEM_WHY = False, ""


def netem_probe():
    """Whether netem queues can be made here (hosts_up first)."""
    global NETEM, NETEM_WHY
    r = nsexec(NS["sw"], "tc", "qdisc", "add", "dev", "p-h1", "root", "netem", "delay", "1ms",
               check=False)
    NETEM = r.returncode == 0
    NETEM_WHY = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "tc failed"
    if NETEM:
        nsexec(NS["sw"], "tc", "qdisc", "del", "dev", "p-h1", "root")


# The pids of the ranks this run started: libfabric's shm names its files "<pid>:...", and
# only those are this run's to judge (other tests may run beside it and make their own, such
# as Python's multiprocessing semaphores). The native shm backend leaves nothing by name.
STARTED = set()


def ours(name):
    return name.split(":", 1)[0] in STARTED


def shm_objects():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def free_port():
    """A TCP port free on this host now, for a hub outside the namespaces (a local path): a
    fixed one there is shared with every other run of the suite on this machine, whose hub
    may hold it (this hub then fails) or take this run's spokes."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def start(rank, host, path, args, env_extra=None):
    # the driver's own settings stay here: tfab warns of TFAB_ variables it does not know
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFAB_FAULTS_")}
    env.update({"TFAB_PROVIDER": path, "TFAB_OP_TIMEOUT_MS": str(DEADLINE_MS),
                "TFAB_HEARTBEAT_MS": str(HEARTBEAT_MS), "TFAB_TEST_SLACK_MS": str(SLACK_MS),
                "TFAB_LOG_LEVEL": os.environ.get("TFAB_FAULTS_LOG_LEVEL", "warn")})
    if path == "ofi:verbs":
        # verbs;ofi_rxm: as the verbs suite runs it (doc/verbs-vm.md)
        env.update({"FI_PROVIDER": "verbs", "FI_UNIVERSE_SIZE": "64"})
    elif path.startswith("ofi:"):
        env.update({"FI_PROVIDER": path[4:], "TFAB_OFI_DOMAIN": "eth0"})
    cmd = [rank] + [str(a) for a in args]
    if path not in LOCAL:
        cmd = ["ip", "netns", "exec", NS[host]] + cmd
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    STARTED.add(str(proc.pid))  # `ip netns exec` execs the rank: the same pid
    return proc


def log_tail(out, n=12):
    """The library's last log lines in a process's output (warnings and errors, stamped with
    the driver's clock), and where it spent long outside the library or in one call."""
    lines = [l for l in out.splitlines() if l.startswith(("tfab ", "STALL "))]
    return "\n".join("        " + l for l in lines[-n:]) or "        (no log lines)"


def parse(out):
    fails, summary = [], None
    for line in out.splitlines():
        if line.startswith("FAIL "):
            fails.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
        elif line.startswith("SUMMARY "):
            summary = dict(kv.split("=", 1) for kv in line.split()[1:])
    return fails, summary


# How long the ranks may take to start (a VM under emulation takes seconds).
READY_S = 120


def wait_ready(procs, early):
    """Reads each rank's output (unbuffered) to its READY line; what else it printed meanwhile
    goes to early[h]. Returns the ranks not ready in time."""
    deadline = time.time() + READY_S
    late = []
    for h, p in procs.items():
        data, fd = b"", p.stdout.fileno()
        while b"READY\n" not in data:
            ready, _, _ = select.select([fd], [], [], max(0, deadline - time.time()))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                late.append(h)
                break
            data += chunk
        early[h] = data.replace(b"READY\n", b"", 1).decode(errors="replace")
    return late


def run_case(rank, name, path):
    paths, h1_bytes, secs, fault, at, length = CASES[name]
    hub_host = "h0"
    hub_addr = {"shm": "127.0.0.1", "verbs": RDMA_ADDR, "ofi:verbs": RDMA_ADDR}.get(
        path, ADDR[hub_host])
    port = free_port() if path in LOCAL else PORT
    procs = {"h0": start(rank, "h0", path, ["hub", port])}
    procs["h1"] = start(rank, "h1", path, ["spoke", hub_addr, port, h1_bytes])
    procs["h2"] = start(rank, "h2", path, ["spoke", hub_addr, port, MIB])
    problems, notes, early = [], [], {}
    # The case's clock starts once every rank is up: each is told when it ends.
    late = wait_ready(procs, early)
    if late:
        problems.append("not ready within %d s: %s" % (READY_S, ", ".join(late)))
    end_ms = int(time.time() * 1000) + int(secs * 1000)
    def tell(line, close=False):
        for p in procs.values():
            if p.stdin is None:
                continue
            try:
                p.stdin.write(line)
                p.stdin.flush()
                if close:
                    p.stdin.close()
            except OSError:
                pass  # it ended already (or was killed): judged by its output
            if close:
                p.stdin = None  # closed: communicate() below only reads

    # The end, now; then "FAULT MS" once the fault has begun: the ranks judge an operation's
    # hang from its post, or from the fault where that came later (fault_rank.c), since the
    # deadlines bound a peer's silence, not a live peer's pace.
    tell("%d\n" % end_ms)
    time.sleep(at)
    fault_ms = int(time.time() * 1000)
    kind = fault[0]
    if kind in ("loss", "drop", "netem"):
        fault_on(kind, fault[1])
        tell("FAULT %d\n" % fault_ms)
        time.sleep(length)
        fault_off()
    elif fault[1] == "KILL":
        os.killpg(procs["h1"].pid, signal.SIGKILL)
        tell("FAULT %d\n" % fault_ms)
    else:
        os.killpg(procs["h1"].pid, signal.SIGSTOP)
        tell("FAULT %d\n" % fault_ms)  # the stopped one reads it once resumed
        time.sleep(length)
        os.killpg(procs["h1"].pid, signal.SIGCONT)
    heal_ms = int(time.time() * 1000)
    tell("", close=True)  # nothing more to say
    outs = {}
    limit = end_ms / 1000 + BOUND_MS / 1000 + 10
    for h, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1, limit - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            problems.append("%s hung: killed after the end" % h)
        outs[h] = early[h] + out
    keep = os.environ.get("TFAB_FAULTS_KEEP")
    if keep:
        os.makedirs(keep, exist_ok=True)
        base = os.path.join(keep, "%s-%s-%d" % (name, path.replace(":", "_"), fault_ms))
        for h, out in outs.items():
            with open(base + "-" + h + ".log", "w") as f:
                f.write("end_ms=%d fault_ms=%d heal_ms=%d\n" % (end_ms, fault_ms, heal_ms))
                f.write(out)
    completed = failed = 0
    by_status = {}
    longest = 0
    survivor_ok = 0
    for h, out in outs.items():
        fails, summary = parse(out)
        victim = h == "h1" and kind == "signal"
        if victim and fault[1] == "KILL" and procs[h].returncode != -signal.SIGKILL:
            # killed by us, or it died of something else first (a crash the kill would hide)
            problems.append("%s (the one killed) ended otherwise than by our SIGKILL (rc %s):"
                            "\n%s" % (h, procs[h].returncode, out.strip()[-3000:]))
        if summary is None:
            if not (victim and fault[1] == "KILL"):
                problems.append("%s ended without a summary (rc %s):\n%s"
                                % (h, procs[h].returncode, out.strip()[-3000:]))
            if not victim:
                continue
            # the killed one: what it printed before the kill is still judged below
            summary = {"completed": 0, "failed": 0, "corrupt": 0, "hung": 0}
        elif procs[h].returncode != 0:
            problems.append("%s exited with %d" % (h, procs[h].returncode))
        completed += int(summary["completed"])
        failed += int(summary["failed"])
        if int(summary["corrupt"]):
            problems.append("%s received %s corrupt tensors: %s" % (
                h, summary["corrupt"],
                "; ".join(l for l in out.splitlines() if l.startswith("CORRUPT"))))
        hung = [l for l in out.splitlines() if l.startswith("HUNG")]
        if int(summary["hung"]) and victim:
            # Not judged: once resumed, the stopped process connects again and trades 256 MiB
            # tensors with a live hub, which no deadline bounds (a slow peer is not a dead
            # one); it is judged by ending, and by what the others saw. Said, for whoever
            # reads the log.
            notes.append("%s (the stopped one) had %s operations pending past %d ms after it "
                         "resumed: %s" % (h, summary["hung"], BOUND_MS, "; ".join(hung)))
        elif int(summary["hung"]):
            problems.append("%s had %s operations hang past %d ms after their post or the "
                            "fault: %s\n%s" % (h, summary["hung"], BOUND_MS, "; ".join(hung),
                                                log_tail(out)))
        if h == "h2":
            survivor_ok = int(summary["completed"])
        for f in fails:
            by_status[f["status"]] = by_status.get(f["status"], 0) + 1
            if not f["status"].startswith("TFAB_ERR_"):
                problems.append("%s: a failure with no named status: %s" % (h, f))
            post, when = int(f["post_ms"]), int(f["fail_ms"])
            if when < fault_ms:
                problems.append("%s: a failure before any fault: %s\n%s" % (h, f, log_tail(out)))
            if victim:
                continue  # a stopped process sees nothing while stopped
            took = when - max(post, fault_ms)
            if kind == "signal" or when <= heal_ms + BOUND_MS:
                longest = max(longest, took)
            if took > BOUND_MS:
                problems.append("%s: a failure surfaced %d ms after its fault (bound %d): %s"
                                "\n%s" % (h, took, BOUND_MS, f, log_tail(out)))
    if survivor_ok < 2:
        problems.append("the survivor (h2) completed only %d transfers" % survivor_ok)
    if kind == "drop":
        fails1, s1 = parse(outs["h1"])
        if s1 and int(s1["connections"]) < 2:
            problems.append("h1 did not connect again after the partition healed")
    statuses = ", ".join("%s %d" % kv for kv in sorted(by_status.items())) or "none"
    print("case %-10s %-11s completed %5d  failed %3d (%s)  longest to surface %4d ms "
          "(bound %d)  %s" % (name, path, completed, failed, statuses, longest, BOUND_MS,
                              "ok" if not problems else "FAILED"))
    for p in problems:
        print("    " + p)
    for n in notes:
        print("    note: " + n)
    return not problems


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rank = os.path.abspath(sys.argv[1])
    # (case, path, named): a named one must run; of the rest, what this machine lacks is said
    runs = []
    for arg in sys.argv[2:]:
        name, _, path = arg.partition(":")
        if name not in CASES or (path and path not in CASES[name][0]):
            print("unknown case or path: %s (cases: %s)" % (arg, ", ".join(
                "%s:%s" % (n, "|".join(c[0])) for n, c in CASES.items())))
            return 2
        runs += [(name, p, True) for p in ([path] if path else CASES[name][0])]
    if not runs:
        runs = [(n, p, False) for n, c in CASES.items() for p in c[0]]
        for n, p in BY_NAME_ONLY:
            runs.remove((n, p, False))
            print("case %-10s %-11s not run unless named (%s:%s): %s"
                  % (n, p, n, p, BY_NAME_ONLY[(n, p)]))
    if os.geteuid() != 0:
        skip("the fault suite makes network namespaces: it needs root")
    for tool in ("ip", "nft"):
        if sh("sh", "-c", "command -v " + tool, check=False).returncode:
            skip("%s not found (Debian: %s)" % (tool, "iproute2" if tool == "ip" else "nftables"))
    # meson's timeout sends SIGTERM: the namespaces still go (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    stale_hosts_down()
    shm_before = shm_objects()
    try:
        hosts_up()
    except subprocess.CalledProcessError as e:
        hosts_down()
        skip("cannot make test hosts from network namespaces here: %s: %s"
             % (" ".join(e.cmd), e.stdout.strip()))
    ok = True
    try:
        if any(CASES[n][3][0] in ("loss", "drop") for n, _, _ in runs):
            nft_up()
        netem_probe()
        for name, path, named in runs:
            why = lacks(name, path)
            if why:
                print("case %-10s %-11s not run: %s" % (name, path, why))
                ok &= not named
                continue
            ok &= run_case(rank, name, path)
            fault_off()
    finally:
        hosts_down()
    left = sorted(n for n in shm_objects() - shm_before if ours(n))
    # A SIGKILLed process leaves its segment for the survivors to remove: they must have.
    if left:
        print("left in /dev/shm: " + " ".join(left))
        ok = False
    leftover = sh("ip", "netns", "list").stdout
    if TAG in leftover:
        print("namespaces left behind: " + leftover)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
