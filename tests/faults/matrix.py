#!/usr/bin/python3
"""matrix.py - the fault matrix: every fault scenario, under seeds, with
the figures of each run and one table for all.

A scenario is one of the fault tests in tests/integration (each starts a
coordinator and agents - network namespaces where it partitions - runs a
real job, injects its fault at an instant drawn from KOLO_SEED, checks
what must hold and, for the elastic ones, prints `RESULT {json}` through
elastic_report.py). This runner gives each run its seed, times it, keeps
its output, and aggregates:

  runs / passed             a failed run keeps its seed: KOLO_SEED=<seed>
                            bash tests/integration/<script> replays it
  faults, resets            faults injected; resets survived / attempted
  steps lost (max)          against the job's commit interval
  detect, recover (s)       p50 and p99 over every fault of every run
  orphans                   worker processes left behind (must be 0)

What a scenario checks beyond the figures (acknowledged snapshots lost =
0 and PRAGMA integrity_check after coordinator kills, no host lost on a
clock step, nothing acknowledged lost on a full disk, strangers refused on
the data plane, ...) is in its script; a run passes only if all of it held.

    tests/faults/matrix.py --build build [--runs N] [--seed S]
                           [--only a,b] [--md out.md] [--json out.json]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
IT = os.path.join(ROOT, "tests", "integration")

# name: (script, what it injects)
SCENARIOS = {
    "worker_kill": ("test_elastic_kill20.sh", "SIGKILL of a random worker, 20 times, at seeded instants"),
    "agent_kill": ("test_elastic_agent_kill.sh", "SIGKILL of an agent and its workers"),
    "coordinator_kill": ("test_elastic_coordinator_kill.sh",
                         "SIGKILL of the coordinator, during snapshot commits"),
    "partition": ("test_elastic_partition.sh",
                  "a host cut off by nftables, shorter and longer than the lease"),
    "frozen_worker": ("test_elastic_frozen.sh", "SIGSTOP of a worker (and a kill of another)"),
    "coordinator_restart": ("test_coordinator_resume.sh",
                            "kill -9 of the coordinator three times under a fixed-size job"),
    "disk_full": ("test_full_disk.sh", "no space left under the coordinator's database"),
    "clock_step": ("test_clock_step.sh", "the coordinator's wall clock +10 min, then back"),
    "connection_flood": ("test_connection_flood.sh",
                         "3,300 held-open connections to the RPC and HTTP ports"),
    "dataplane_strangers": ("test_dataplane_auth.sh",
                            "garbage, idle and forged connections on a rank's data port"),
    "stop_parked": ("test_coordinator_stop.sh",
                    "SIGTERM under parked calls of every kind, 4 rounds (an AddressSanitizer "
                    "coordinator from build-address when there is one)"),
    "lease_partition": ("test_lease_partition.sh",
                        "four 2 s nftables cuts of a 3 s lease (0.67 of it)"),
    "unauth_frames": ("test_unauth_memory.sh",
                      "100 x 32 MiB and 600 slow 1 MiB unauthenticated frames, RSS sampled"),
    "parked_flood": ("test_parked_flood.sh",
                     "960 parked StreamOutput calls of one client beside a training job"),
}


def env_for(build):
    b = os.path.abspath(build)
    env = dict(os.environ)
    env.update({
        "KOLO": os.path.join(b, "bin", "kolo"),
        "KOLO_LIBRARY": os.path.join(b, "lib", "libkolo.so"),
        "KOLO_EXAMPLE": os.path.join(b, "bin", "kolo-example-allreduce"),
        "KOLO_STORE_CHECK": os.path.join(b, "tests", "store", "kolo-test-store-check"),
        "KOLO_ELASTIC_WORKER": os.path.join(b, "tests", "integration", "kolo-test-elastic-worker"),
    })
    # stop_parked's coordinator: the AddressSanitizer build scripts/test.sh
    # makes, where there is one (its workers keep the normal libkolo)
    asan = os.path.join(ROOT, "build-address", "bin", "kolo")
    if os.path.exists(asan) and "KOLO_COORD" not in env:
        env["KOLO_COORD"] = asan
    return env


def run_one(name, seed, env, timeout, logdir):
    script = os.path.join(IT, SCENARIOS[name][0])
    e = dict(env, KOLO_SEED=str(seed))
    t0 = time.time()
    try:
        p = subprocess.run(["bash", script], env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        rc, out = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as x:
        rc, out = 124, (x.stdout or b"").decode(errors="replace") + "\nTIMEOUT\n"
    took = time.time() - t0
    with open(os.path.join(logdir, "%s-%d.log" % (name, seed)), "w") as f:
        f.write(out)
    results = []
    for line in out.splitlines():
        if line.startswith("RESULT "):
            try:
                results.append(json.loads(line[7:]))
            except ValueError:
                pass
    return {"scenario": name, "seed": seed, "rc": rc, "seconds": round(took, 1),
            "results": results}


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def aggregate(runs):
    rows = []
    for name in SCENARIOS:
        rs = [r for r in runs if r["scenario"] == name]
        if not rs:
            continue
        res = [x for r in rs for x in r["results"]]
        detect = [d for x in res for d in (x.get("detect_s") or {}).get("all", [])]
        recover = [d for x in res for d in (x.get("recover_s") or {}).get("all", [])]
        lost = [x["steps_lost_max"] for x in res if x.get("steps_lost_max") is not None]
        rows.append({
            "scenario": name,
            "injects": SCENARIOS[name][1],
            "runs": len(rs),
            "passed": sum(1 for r in rs if r["rc"] == 0),
            "skipped": sum(1 for r in rs if r["rc"] == 77),
            "failed_seeds": [r["seed"] for r in rs if r["rc"] not in (0, 77)],
            "faults": sum(x.get("faults", 0) for x in res) or None,
            "resets": "%d/%d" % (sum(x.get("resets_survived", 0) for x in res),
                                 sum(x.get("resets_attempted", 0) for x in res)) if res else None,
            "steps_lost_max": max(lost) if lost else None,
            "commit_interval": next((x.get("commit_interval") for x in res
                                     if x.get("commit_interval")), None),
            "detect_p50": pct(detect, 50), "detect_p99": pct(detect, 99),
            "recover_p50": pct(recover, 50), "recover_p99": pct(recover, 99),
            "orphans": sum(x.get("orphans", 0) or 0 for x in res) if res else 0,
            "seconds_p50": statistics.median(r["seconds"] for r in rs),
        })
    return rows


def fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float):
        return "%.2f%s" % (v, unit)
    return "%s%s" % (v, unit)


def markdown(rows, seeds_note):
    out = ["| scenario | injects | runs | passed | faults | resets survived | steps lost (max / commit) "
           "| detect p50 / p99 | recover p50 / p99 | orphans | run time p50 |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        passed = "%d%s" % (r["passed"], " (%d skipped)" % r["skipped"] if r["skipped"] else "")
        if r["failed_seeds"]:
            passed += " (failed: seeds %s)" % ", ".join(map(str, r["failed_seeds"]))
        lost = "–" if r["steps_lost_max"] is None else "%d / %s" % (r["steps_lost_max"],
                                                                   r["commit_interval"] or "–")
        out.append("| %s | %s | %d | %s | %s | %s | %s | %s / %s | %s / %s | %d | %s |" % (
            r["scenario"], r["injects"], r["runs"], passed, fmt(r["faults"]), fmt(r["resets"]),
            lost, fmt(r["detect_p50"], " s"), fmt(r["detect_p99"], " s"),
            fmt(r["recover_p50"], " s"), fmt(r["recover_p99"], " s"), r["orphans"],
            fmt(r["seconds_p50"], " s")))
    out.append("")
    out.append(seeds_note)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=1, help="runs per scenario (seeds drawn from --seed)")
    ap.add_argument("--seed", type=int, default=None, help="the seed the runs' seeds are drawn from")
    ap.add_argument("--only", default="", help="comma-separated scenarios")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--md", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None, help="where each run's output goes")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error("unknown scenario %s (known: %s)" % (n, ", ".join(SCENARIOS)))
    master = a.seed if a.seed is not None else random.randrange(1, 1 << 30)
    rnd = random.Random(master)
    logdir = a.logs or os.path.join(os.path.abspath(a.build), "faults-logs")
    os.makedirs(logdir, exist_ok=True)
    env = env_for(a.build)
    print("fault matrix: %d scenario(s) x %d run(s), seed %d, logs in %s"
          % (len(names), a.runs, master, logdir), flush=True)
    runs = []
    for i in range(a.runs):
        for n in names:
            seed = rnd.randrange(1, 1000000)
            r = run_one(n, seed, env, a.timeout, logdir)
            runs.append(r)
            verdict = {0: "passed", 77: "skipped"}.get(r["rc"], "FAILED (rc %d)" % r["rc"])
            print("  %-20s seed %-7d %-16s %6.1f s" % (n, seed, verdict, r["seconds"]), flush=True)
    rows = aggregate(runs)
    note = ("Seed %d drew every run's seed; a run replays with KOLO_SEED=<its seed> bash "
            "tests/integration/<its script>." % master)
    md = markdown(rows, note)
    print()
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": master, "runs": runs, "rows": rows}, f, indent=1)
    return 0 if all(r["rc"] in (0, 77) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
