#!/usr/bin/env python3
"""The fault suite (issue 12; doc/faults.md): test hosts made of network namespaces joined by a
bridge, and faults between them, while fault_rank processes trade tensors.

    faults.py FAULT_RANK [CASE ...]

Hosts h0 (the hub), h1 and h2 (spokes) each have one interface, eth0, on a bridge in a switch
namespace; the faults are nftables rules in the switch on h1's port (so neither end's own
stack sees them: a drop there is loss, not an error), or signals to h1's process. h2 is the
survivor: whatever happens to h1, its transfers must go on.

Each case asserts: every transfer completed with its data intact or failed with a named status;
no failure took longer to surface than TFAB_OP_TIMEOUT_MS plus TFAB_HEARTBEAT_MS (plus the
slack below) after its fault began; nothing hung; the survivor completed transfers throughout;
no process, namespace or shared-memory object is left behind. It prints, per case, transfers
completed, failed (by status), and the longest time a failure took to surface.

Needs root and iproute2 with nftables; where namespaces cannot be made it exits 77 and says why.
Delay, reordering and duplication need netem, which this kernel lacks: not here (doc/faults.md).
"""
import os
import re
import signal
import subprocess
import sys
import time

DEADLINE_MS = 3000
HEARTBEAT_MS = 500
# Scheduling on a loaded two-core machine, the 50 ms liveness period, the coarse clock.
SLACK_MS = 700
BOUND_MS = DEADLINE_MS + HEARTBEAT_MS + SLACK_MS
PORT = 17321
TAG = "tf%d" % os.getpid()
NS = {h: "%s-%s" % (TAG, h) for h in ("sw", "h0", "h1", "h2")}
ADDR = {"h0": "10.77.0.1", "h1": "10.77.0.2", "h2": "10.77.0.3"}
MIB = 1 << 20

# name: (paths, h1's tensor bytes, run seconds, fault, fault start s, fault length s)
CASES = {
    "loss-1pct": (["ofi:tcp", "ofi:sockets"], MIB, 6, ("loss", 1), 0.5, 5),
    "loss-10pct": (["ofi:tcp", "ofi:sockets"], MIB, 8, ("loss", 10), 0.5, 7),
    "partition": (["ofi:tcp", "ofi:sockets"], MIB, 14, ("drop", 100), 2, 6),
    "kill": (["shm", "ofi:tcp", "ofi:sockets"], 256 * MIB, 8, ("signal", "KILL"), 2.5, 0),
    "stop": (["shm", "ofi:tcp", "ofi:sockets"], 256 * MIB, 12, ("signal", "STOP"), 2.5, 6),
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
    nsexec(sw, "nft", "add table bridge faults")
    nsexec(sw, "nft", "add chain bridge faults links "
           "{ type filter hook forward priority 0 ; }")


def hosts_down():
    for ns in NS.values():
        sh("ip", "netns", "del", ns, check=False)


def fault_on(kind, amount):
    """h1's port on the switch drops amount % of what enters or leaves it."""
    for d in ("iifname", "oifname"):
        chance = "numgen random mod 100 < %d " % amount if amount < 100 else ""
        nsexec(NS["sw"], "nft", "add rule bridge faults links %s p-h1 %sdrop" % (d, chance))


def fault_off():
    nsexec(NS["sw"], "nft", "flush chain bridge faults links")


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


def start(rank, host, path, args, env_extra=None):
    env = dict(os.environ)
    env.update({"TFAB_PROVIDER": path, "TFAB_OP_TIMEOUT_MS": str(DEADLINE_MS),
                "TFAB_HEARTBEAT_MS": str(HEARTBEAT_MS), "TFAB_TEST_SLACK_MS": str(SLACK_MS),
                "TFAB_LOG_LEVEL": "warn"})
    if path.startswith("ofi:"):
        env.update({"FI_PROVIDER": path[4:], "TFAB_OFI_DOMAIN": "eth0"})
    cmd = [rank] + [str(a) for a in args]
    # The shared-memory path needs both ends on one host: this one, outside the namespaces
    # (each `ip netns exec` has a mount namespace of its own, which tfab counts as a host).
    if path != "shm":
        cmd = ["ip", "netns", "exec", NS[host]] + cmd
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    STARTED.add(str(proc.pid))  # `ip netns exec` execs the rank: the same pid
    return proc


def log_tail(out, n=12):
    """The library's last log lines in a process's output (warnings and errors)."""
    lines = [l for l in out.splitlines() if l.startswith("tfab ")]
    return "\n".join("        " + l for l in lines[-n:]) or "        (no log lines)"


def parse(out):
    fails, summary = [], None
    for line in out.splitlines():
        if line.startswith("FAIL "):
            fails.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
        elif line.startswith("SUMMARY "):
            summary = dict(kv.split("=", 1) for kv in line.split()[1:])
    return fails, summary


def run_case(rank, name, path):
    paths, h1_bytes, secs, fault, at, length = CASES[name]
    t0 = int(time.time() * 1000)
    end_ms = t0 + int(secs * 1000)
    hub_host = "h0"
    hub_addr = "127.0.0.1" if path == "shm" else ADDR[hub_host]
    procs = {"h0": start(rank, "h0", path, ["hub", PORT, end_ms])}
    time.sleep(0.3)
    procs["h1"] = start(rank, "h1", path, ["spoke", hub_addr, PORT, end_ms, h1_bytes])
    procs["h2"] = start(rank, "h2", path, ["spoke", hub_addr, PORT, end_ms, MIB])
    problems, notes = [], []
    time.sleep(at)
    fault_ms = int(time.time() * 1000)
    kind = fault[0]
    if kind in ("loss", "drop"):
        fault_on(kind, fault[1])
        time.sleep(length)
        fault_off()
    elif fault[1] == "KILL":
        os.killpg(procs["h1"].pid, signal.SIGKILL)
    else:
        os.killpg(procs["h1"].pid, signal.SIGSTOP)
        time.sleep(length)
        os.killpg(procs["h1"].pid, signal.SIGCONT)
    heal_ms = int(time.time() * 1000)
    outs = {}
    limit = end_ms / 1000 + BOUND_MS / 1000 + 10
    for h, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1, limit - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            problems.append("%s hung: killed after the end" % h)
        outs[h] = out
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
        if int(summary["hung"]) and victim:
            # Not judged: the stopped process's own clock jumped while it was stopped; it is
            # judged by ending, and by what the others saw. Said, for whoever reads the log.
            notes.append("%s (the stopped one) had %s operations pending past %d ms after it "
                         "resumed: %s" % (h, summary["hung"], BOUND_MS, "; ".join(
                             l for l in out.splitlines() if l.startswith("HUNG"))))
        elif int(summary["hung"]):
            problems.append("%s had %s operations hang past %d ms"
                            % (h, summary["hung"], BOUND_MS))
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
                                % (h, took, BOUND_MS, f))
    if kind == "loss" or kind == "drop":
        pass
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
    names = sys.argv[2:] or list(CASES)
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
        for name in names:
            for path in CASES[name][0]:
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
