#!/usr/bin/env python3
"""tfab beside UCX, point to point, on the same kind of path, in one run.

Each round runs every case once, tfab and UCX in turn, so that the machine's drifts in speed
fall on both; the table gives each figure's median over the rounds and the ratio of the
medians. The paths: tfab's native shm backend against UCX's `sm` transports (UCX_TLS=sm), and
tfab's ofi:tcp against UCX's `tcp` (UCX_TLS=tcp on the loopback device).

What is compared, per path:
  - 8 B one way: tfab-perf raw, tensor and tensor --no-request=32 (lat_us, half a round trip)
    against ucx_perftest tag_lat (its overall average latency, also half a round trip);
  - 8 B messages per second with 64 in flight: tfab-perf's rate (fetches per second) against
    ucx_perftest tag_bw -O 64 (its overall message rate);
  - 4 KiB to 1 MiB: tfab-perf tensor at a window of 16 against tag_bw -O 16;
  - 64 MiB: tfab-perf tensor (and raw) at a window of 4 against ucp_put_bw (sm) or tag_bw (tcp),
    -O 4, with tfab-perf memcpy at the same window as the bound on one host.

usage: tools/bench/vs-ucx.py [--build DIR] [--rounds N] [--paths shm,tcp] [--quick] [--json F]
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tfab(perf, test, provider, sizes, window, iters, extra=()):
    """One tfab-perf process; returns {bytes: result object}."""
    cmd = [perf, test, "-s", sizes, "-w", str(window), "--json"] + list(extra)
    if iters:
        cmd += ["-n", str(iters)]
    if provider:
        cmd += ["-p", provider]
    env = dict(os.environ)
    if provider == "ofi:tcp":
        env["FI_PROVIDER"] = "tcp"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode:
        sys.exit(f"vs-ucx: {' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    res = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            res[r["bytes"]] = r
    return res


# Final: iterations, latency (median, average, overall), bandwidth (average, overall, MiB/s),
# message rate (average, overall); an average can read "inf".
FINAL = re.compile(r"^Final:\s+(\d+)" + r"\s+([\d.]+|inf)" * 7 + r"\s*$")


def ucx(test, tls, size, iters, outstanding=None):
    """One ucx_perftest pair (server, then client) on this host; returns the client's
    Final line: lat_us (overall average), GBps (overall, 10^9 bytes) and rate (msg/s)."""
    env = dict(os.environ, UCX_TLS=tls)
    if tls == "tcp":
        env["UCX_NET_DEVICES"] = "lo"
    port = str(free_port())
    server = subprocess.Popen(["ucx_perftest", "-p", port], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        cmd = ["ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s", str(size), "-n",
               str(iters)]
        if outstanding:
            cmd += ["-O", str(outstanding)]
        for attempt in range(50):  # until the server listens
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            m = next((FINAL.match(l) for l in out.stdout.splitlines() if FINAL.match(l)), None)
            if m or server.poll() is not None:
                break
            time.sleep(0.1)
        if not m:
            sys.exit(f"vs-ucx: {' '.join(cmd)} (UCX_TLS={tls}) gave no result: "
                     f"{(out.stdout + out.stderr).strip()[-500:]}")
        v = [float(x) for x in m.groups()[1:]]
        return {"lat_us": v[2], "GBps": v[4] * MIB / 1e9, "rate": v[6]}
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def cases(path, quick):
    """(name, what is compared, tfab runner, ucx runner, figure, higher is better)."""
    lat_n, rate_n = (20000, 200000) if quick else (100000, 1000000)
    prov = "shm" if path == "shm" else "ofi:tcp"
    tls = "sm" if path == "shm" else "tcp"
    if path == "tcp":
        lat_n, rate_n = lat_n // 10, rate_n // 10
    big_put = "ucp_put_bw" if path == "shm" else "tag_bw"
    mid = [4096, 65536, MIB]
    out = []
    # 8 B one way: three tfab modes against tag_lat.
    out.append(("lat8", [
        ("raw", lambda p: tfab(p, "raw", prov, "8", 1, lat_n)[8]),
        ("tensor", lambda p: tfab(p, "tensor", prov, "8", 1, lat_n)[8]),
        ("no-request", lambda p: tfab(p, "tensor", prov, "8", 64, lat_n,
                                      ["--no-request=32"])[8]),
    ], lambda: ucx("tag_lat", tls, 8, lat_n), "lat_us", False))
    out.append(("rate8", [
        ("raw", lambda p: tfab(p, "raw", prov, "8", 64, rate_n)[8]),
        ("tensor", lambda p: tfab(p, "tensor", prov, "8", 64, rate_n)[8]),
        ("no-request", lambda p: tfab(p, "tensor", prov, "8", 64, rate_n,
                                      ["--no-request=32"])[8]),
    ], lambda: ucx("tag_bw", tls, 8, rate_n, 64), "rate", True))
    for size in mid:
        iters = max(200, min(100000, (2 << 30) // size // (4 if quick else 1) //
                             (1 if path == "shm" else 4)))
        out.append((f"bw{size}", [
            ("tensor", lambda p, s=size, i=iters: tfab(p, "tensor", prov, str(s), 16, i)[s]),
        ], lambda s=size, i=iters: ucx("tag_bw", tls, s, i, 16), "GBps", True))
    big = 64 * MIB
    big_n = 32 if quick else 64
    tf = [("raw", lambda p: tfab(p, "raw", prov, str(big), 4, big_n)[big]),
          ("tensor", lambda p: tfab(p, "tensor", prov, str(big), 4, big_n)[big])]
    if path == "shm":
        tf.append(("memcpy", lambda p: tfab(p, "memcpy", None, str(big), 4, big_n)[big]))
    out.append(("bw64M", tf, lambda: ucx(big_put, tls, big, big_n, 4), "GBps", True))
    return out


LABEL = {"lat8": "8 B one way, us", "rate8": "8 B per second, window 64",
         "bw64M": "64 MiB, GB/s, window 4"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paths", default="shm,tcp")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    perf = os.path.join(a.build, "tools", "tfab-perf")
    if not os.access(perf, os.X_OK):
        sys.exit(f"vs-ucx: no {perf} (build first)")
    if not shutil.which("ucx_perftest"):
        sys.exit("vs-ucx: ucx_perftest not found (apt-get install ucx-utils)")
    paths = a.paths.split(",")
    plan = {p: cases(p, a.quick) for p in paths}
    runs = {}  # (path, case, who) -> [figure]
    for rnd in range(a.rounds):
        for p in paths:
            for name, tf, ux, fig, _ in plan[p]:
                # tfab first in even rounds, UCX first in odd ones
                order = [("tfab", tf), ("ucx", ux)]
                if rnd % 2:
                    order.reverse()
                for who, run in order:
                    if who == "ucx":
                        runs.setdefault((p, name, "UCX"), []).append(run()[fig])
                    else:
                        for mode, fn in run:
                            runs.setdefault((p, name, mode), []).append(fn(perf)[fig])
        print(f"vs-ucx: round {rnd + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    host = os.uname()
    print(f"tfab vs UCX ({subprocess.run(['ucx_info', '-v'], capture_output=True, text=True).stdout.splitlines()[0].lstrip('# ')}), "
          f"{host.nodename}, {os.cpu_count()} cores, {a.rounds} interleaved rounds, medians")
    print(f"{'path':5} {'what':28} {'tfab mode':11} {'tfab':>12} {'UCX':>12} {'tfab/UCX':>9}"
          f" {'bound':>12}")
    for p in paths:
        for name, tf, _, fig, higher in plan[p]:
            u = statistics.median(runs[(p, name, "UCX")])
            bound = None
            if (p, name, "memcpy") in runs:
                bound = statistics.median(runs[(p, name, "memcpy")])
            label = LABEL.get(name) or f"{int(name[2:]) // 1024} KiB, GB/s, window 16"
            for mode, _ in tf:
                if mode == "memcpy":
                    continue
                t = statistics.median(runs[(p, name, mode)])
                fmt = (lambda v: f"{v / 1e6:.2f} M") if fig == "rate" else (lambda v: f"{v:.3f}")
                b = f"memcpy {bound:.2f}" if bound else ""
                print(f"{p:5} {label:28} {mode:11} {fmt(t):>12} {fmt(u):>12} {t / u:>9.2f}"
                      f" {b:>12}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"|".join(k): v for k, v in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
