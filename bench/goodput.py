#!/usr/bin/python3
"""Goodput under failures: the effective training time ratio (ETTR) of the
same job under kolo elastic and under torchrun, while a seeded schedule
SIGKILLs training workers. bench/goodput.sh builds kolo and calls this.

Per configuration (kolo or torchrun, one kill every P seconds or none) the
job (bench/goodput_train.py: the synthetic CNN at np 4, a commit or a
checkpoint every K steps) is launched; the measuring window of W seconds
opens when rank 0 starts its first step (the start-up, the same with or
without failures, is reported apart); during it a worker process
(`goodput_train.py`, never `kolo run` or torchrun's agent) chosen at
random is SIGKILLed at P x (i + u), u uniform in [0.25, 0.75), i = 0, 1,
...; at the end the launcher's process group gets SIGINT, then SIGKILL.
kolo and torchrun of the same repetition and period share the seed, so
they see the same kill times and the same draws.

The analysis reads the JSON lines the workers and this driver wrote:
  - the last execution of each step number counts, earlier ones (before a
    rollback) are redone work; ETTR = the counted steps' durations / W;
  - per failure: detect (the kill -> kolo: a survivor's collective fails;
    torchrun: its agent has started the new workers), re-form (-> kolo:
    the reset callback of the new generation; torchrun: init_process_group
    returned on rank 0), restore (-> the state is in place and the loop
    starts: kolo's sync broadcast, torchrun's DDP wrap after the checkpoint
    load), redone (the discarded steps' durations) and the time lost in all
    (the last step done before the kill -> the first step started after
    the restore, plus the redone steps, plus for kolo the grow-back pause:
    the reset without rollback that takes the replacement worker in, from
    the last step before it to the first step after it); for kolo also the
    kill -> the first step back at 4 workers;
  - p50 and p99 (nearest rank) over the failures of all repetitions.

--reanalyse RAW reads an earlier invocation's raw directory (its
report.json and every run's events.jsonl) and writes its report again
with this file's analysis.
"""
import argparse
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "goodput_train.py")
PY = "/usr/bin/python3"
NP = 4


def env_default(name, default, kind=str):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


def parse():
    smoke = os.environ.get("SMOKE", "0") == "1"
    p = argparse.ArgumentParser(description="ETTR under failures: kolo elastic against torchrun")
    p.add_argument("--smoke", action="store_true", default=smoke,
                   help="one kill 5 s into training per launcher, no references; checks only (env SMOKE=1)")
    p.add_argument("--window", type=float, default=env_default("W", 60.0 if smoke else 180.0, float),
                   help="seconds measured per configuration (env W; 180, smoke: at most 60, ending 5 steps after the recovery)")
    p.add_argument("--periods", default=env_default("PERIODS", "60 15"),
                   help="seconds between kills, one configuration each (env PERIODS, '60 15')")
    p.add_argument("--seed", type=int, default=env_default("SEED", random.randrange(1000000), int))
    p.add_argument("--reps", type=int, default=env_default("REPS", 1, int), help="repetitions (env REPS, 1)")
    p.add_argument("--impls", default=env_default("IMPLS", "kolo torchrun"), help="env IMPLS")
    p.add_argument("--commit-every", type=int, default=env_default("COMMIT_EVERY", 10, int))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--kolo", default=os.environ.get("KOLO") or os.path.join(
        os.environ.get("KOLO_BUILD_DIR") or os.path.join(ROOT, "build"), "bin", "kolo"))
    p.add_argument("--torchrun", default=os.environ.get("TORCHRUN", "/usr/bin/torchrun"))
    p.add_argument("--raw", default="", help="directory for the runs' files (default build/bench-peers/raw/<stamp>-goodput)")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--stamp", default=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    p.add_argument("--reanalyse", default="", metavar="RAW",
                   help="analyse again the runs of an earlier invocation (its raw directory) and write its results")
    a = p.parse_args()
    a.periods = [float(x) for x in a.periods.split()]
    a.impls = a.impls.split()
    if a.smoke:
        a.window = min(a.window, 60.0)
    return a


def say(msg):
    sys.stderr.write("[goodput %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# ---------------------------------------------------------------- the run


class EventLog:
    """The run's JSON lines: the driver appends, and reads what the workers appended."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.offset = 0
        self.records = []

    def write(self, ev, **fields):
        rec = {"t": round(time.time(), 6), "ev": ev, "pid": os.getpid(), "rank": -2}
        rec.update(fields)
        os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        return rec

    def poll(self):
        """Records appended since the last call (whole lines only)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        new = []
        for line in data[:end].splitlines():
            try:
                new.append(json.loads(line))
            except ValueError:
                pass
        self.records.extend(new)
        return new


def workers(tag, any_process=False):
    """Live training processes of this run: goodput_train.py with our tag, not the launcher
    (any_process: every process with the tag on its command line, the launcher and kolo's
    per-worker `kolo __exec` too)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X") or tag.encode() not in argv:
            continue
        if any_process or any(x.endswith(b"goodput_train.py") for x in argv[:3]):
            found.append(int(d))
    return sorted(found)


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def launcher_cmd(a, impl, run_dir, log_path, tag):
    train = [TRAIN, "--impl", impl, "--log", log_path, "--commit-every", str(a.commit_every),
             "--batch-size", str(a.batch_size), "--image-size", str(a.image_size), "--tag", tag]
    if impl == "kolo":
        spares = ["--spares", os.environ["SPARES"]] if os.environ.get("SPARES") else []
        return [a.kolo, "run", "-np", str(NP), "--min-np", "2", "--max-np", str(NP),
                "--blacklist-cooldown-range", "1", "2", "--state-dir", os.path.join(run_dir, "state")
                ] + spares + ["--", PY] + train
    # --standalone's rendezvous store is on port 29400; when something else
    # holds it, the same c10d rendezvous on a free port.
    if port_free(29400):
        rdzv = ["--standalone"]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rdzv = ["--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port,
                "--rdzv_id", tag]
    # --redirects/--tee: torch 1.13's Std.from_str cannot map the default 0
    # (or 3) under Python 3.11, whose enum iteration skips them; 1 and 2 work.
    return [a.torchrun] + rdzv + ["--nproc_per_node", str(NP), "--max_restarts", "1000",
                                  "--redirects", "1", "--tee", "2", "--log_dir",
                                  os.path.join(run_dir, "torchrun-logs")] + train + [
        "--ckpt", os.path.join(run_dir, "ckpt.pt")]


def kill_plan(a, rep, period):
    """Kill times (seconds into the window) and the uniform draws that pick the victims."""
    if a.smoke:
        return [(5.0, 0.5)]
    if not period:
        return []
    rng = random.Random("%d-%d-%g" % (a.seed, rep, period))
    plan, i = [], 0
    while True:
        t = period * (i + rng.uniform(0.25, 0.75))
        if t >= a.window:
            return plan
        plan.append((t, rng.random()))
        i += 1


def run_config(a, rep, impl, period, raw):
    name = "rep%d-%s-%s" % (rep, impl, "ref" if not period else "p%g" % period)
    run_dir = os.path.join(raw, name)
    os.makedirs(run_dir, exist_ok=True)
    log = EventLog(os.path.join(run_dir, "events.jsonl"))
    tag = "goodput-%s-%s" % (a.stamp, name)
    cmd = launcher_cmd(a, impl, run_dir, log.path, tag)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.path.join(ROOT, "python") + (":" + os.environ["PYTHONPATH"]
                                                          if os.environ.get("PYTHONPATH") else ""))
    plan = kill_plan(a, rep, period)
    load0 = os.getloadavg()[0]
    say("%s: %s (%d kills planned)" % (name, " ".join(cmd[:3]) + " ...", len(plan)))
    with open(os.path.join(run_dir, "cmd.json"), "w") as f:
        json.dump(cmd, f)
    out = open(os.path.join(run_dir, "launcher.out"), "wb")
    err = open(os.path.join(run_dir, "launcher.err"), "wb")
    launch = log.write("launch", impl=impl, period=period)
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                            cwd=ROOT, start_new_session=True)
    try:
        note, t0, end = watch(a, proc, log, plan, tag)
    finally:
        stop = log.write("stop")
        stop_rc = stop_launcher(proc, tag)
        out.close()
        err.close()
    log.poll()
    load1 = os.getloadavg()[0]
    if note:
        say("%s: %s (see %s)" % (name, note, run_dir))
    return {"name": name, "rep": rep, "impl": impl, "period": period, "dir": run_dir,
            "launch": launch["t"], "t0": t0, "end": end if t0 is not None else None,
            "stop": stop["t"], "launcher_rc": stop_rc, "note": note, "plan": plan,
            "load1_start": load0, "load1_end": load1, "records": log.records}


def watch(a, proc, log, plan, tag):
    """Waits for the first step, kills on the plan, returns (note, window start, window end)."""
    t0, end, note = None, None, ""
    startup = 60 if a.smoke else 180
    deadline = time.time() + startup
    pending = list(plan)
    kill_t = None
    while True:
        time.sleep(0.05)
        new = log.poll()
        now = time.time()
        if t0 is None:
            first = [r for r in new if r["ev"] == "step"]
            if first:
                t0 = first[0]["t"] - first[0]["dur"]
                end = t0 + a.window
                log.write("window", start=t0, end=end)
            elif now > deadline:
                return "no step within %d s of the launch" % startup, None, None
            elif proc.poll() is not None:
                return "the launcher exited (%d) before the first step" % proc.returncode, None, None
            continue
        if pending and now >= t0 + pending[0][0]:
            at, u = pending.pop(0)
            live = workers(tag)
            if live:
                victim = live[min(int(u * len(live)), len(live) - 1)]
                ranks = [r["rank"] for r in log.records if r.get("pid") == victim and r["rank"] >= 0]
                kill_t = log.write("kill", victim=victim, victim_rank=ranks[-1] if ranks else -1,
                          planned=round(t0 + at, 6), live=len(live))["t"]
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                kill_t = log.write("kill-skipped", planned=round(t0 + at, 6))["t"]
        if a.smoke and kill_t is not None:
            restored = [r["t"] for r in log.records if r["ev"] == "restored" and r["t"] > kill_t]
            if restored and sum(1 for r in log.records if r["ev"] == "step"
                                and r["t"] - r["dur"] >= restored[0]) >= 5:
                return note, t0, now
        if now >= end:
            return note, t0, end
        if proc.poll() is not None:
            return "the launcher exited (%d) during the window" % proc.returncode, t0, end


def stop_launcher(proc, tag):
    """SIGINT to the launcher's process group, SIGKILL after 20 s; then any worker left."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        rc = proc.wait(20)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rc = proc.wait()
    for _ in range(50):
        left = workers(tag, any_process=True)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything else the launcher left in its group
    except ProcessLookupError:
        pass
    return rc


# ---------------------------------------------------------------- the analysis


def pct(values, q):
    """Nearest-rank percentile; None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = max(0, min(len(v) - 1, int(-(-q * len(v) // 100)) - 1))
    return v[k]


def first(records, pred):
    for r in records:
        if pred(r):
            return r
    return None


def analyse(run, batch):
    """ETTR, steps counted and redone, and each failure's breakdown, of one run."""
    recs = sorted(run["records"], key=lambda r: r["t"])
    t0, t1 = run["t0"], run["end"]
    res = {"name": run["name"], "impl": run["impl"], "period": run["period"], "rep": run["rep"],
           "note": run["note"], "load1_start": run["load1_start"], "load1_end": run["load1_end"]}
    if t0 is None:
        res.update({"ettr": None, "failures": [], "steps_counted": 0, "steps_redone": 0})
        return res
    window = t1 - t0
    kolo = run["impl"] == "kolo"
    starts = [r for r in recs if r["ev"] == "start"]
    res["startup_s"] = t0 - run["launch"]
    # Steps of rank 0 inside the window (the first starts at t0 exactly).
    steps = [r for r in recs if r["ev"] == "step" and r["t"] <= t1 and r["t"] - r["dur"] >= t0 - 1e-3]
    last = {}
    discarded = []  # (the discarded execution, the time of the one that replaced it)
    for r in steps:
        if r["step"] in last:
            discarded.append((last[r["step"]], r["t"]))
        last[r["step"]] = r
    counted = list(last.values())
    res["window_s"] = window
    res["ettr"] = sum(r["dur"] for r in counted) / window
    res["steps_counted"] = len(counted)
    res["steps_redone"] = len(discarded)
    res["redone_s"] = sum(r["dur"] for r, _ in discarded)
    res["samples_per_s"] = sum(r["size"] * batch for r in counted) / window
    res["step_p50_s"] = pct([r["dur"] for r in steps], 50)
    busy = sum(r["dur"] for r in steps)
    res["between_steps_s"] = window - busy  # start-up excluded: every moment no step ran

    kills = [r for r in recs if r["ev"] == "kill" and t0 <= r["t"] <= t1]
    res["kills_skipped"] = sum(1 for r in recs if r["ev"] == "kill-skipped")
    fails = []
    for i, k in enumerate(kills):
        tk = k["t"]
        tn = kills[i + 1]["t"] if i + 1 < len(kills) else t1
        f = {"t": tk - t0, "victim_rank": k["victim_rank"], "live": k["live"]}
        inside = [r for r in recs if tk < r["t"] <= tn]
        rank0 = lambda ev, after: first(inside, lambda r: r["ev"] == ev and r["rank"] == 0 and r["t"] >= after)
        # Lost time counts from the last step done since the previous kill;
        # with none, the job was still down from that one and counts from tk.
        since = kills[i - 1]["t"] if i else t0
        prev = [r for r in steps if since < r["t"] <= tk]
        prev_done = prev[-1]["t"] if prev else tk
        f["survivor_error_s"] = None
        det = first(inside, lambda r: r["ev"] == "detect")
        if det:
            f["survivor_error_s"] = det["t"] - tk
        if kolo:
            detect = det
            reform = detect and (rank0("re-formed", detect["t"]) or
                                 first(inside, lambda r: r["ev"] == "re-formed" and r["t"] >= detect["t"]))
        else:
            detect = first(inside, lambda r: r["ev"] == "start")
            reform = detect and rank0("init", detect["t"])
        restored = reform and rank0("restored", reform["t"])
        resume = restored and first([r for r in steps if tk < r["t"] <= tn],
                                    lambda r: r["t"] - r["dur"] >= restored["t"] - 1e-3)
        f["detect_s"] = detect["t"] - tk if detect else None
        f["reform_s"] = reform["t"] - detect["t"] if reform else None
        f["restore_s"] = restored["t"] - reform["t"] if restored else None
        f["resume_step"] = restored["step"] if restored else None
        redone = [r for r, t in discarded if tk < t <= tn]
        f["steps_redone"] = len(redone)
        f["redone_s"] = sum(r["dur"] for r in redone)
        f["recovered"] = resume is not None
        f["interrupted"] = detect is not None
        if resume:
            f["to_first_step_s"] = resume["t"] - resume["dur"] - tk
            f["lost_s"] = resume["t"] - resume["dur"] - prev_done + f["redone_s"]
            f["steps_after"] = sum(1 for r in steps if r["t"] - r["dur"] >= restored["t"] - 1e-3 and r["t"] <= tn)
        else:
            f["to_first_step_s"] = f["lost_s"] = None
            f["steps_after"] = 0
        if kolo:
            full = first([r for r in steps if tk < r["t"] <= tn], lambda r: r["size"] == NP and
                         (resume is None or r["t"] >= resume["t"]))
            f["back_to_full_s"] = full["t"] - tk if full else None
            # The grow-back: HostsUpdatedInterrupt at a commit, a reset without rollback.
            intr = first(inside, lambda r: r["ev"] == "interrupt" and (resume is None or r["t"] >= resume["t"]))
            f["growback_pause_s"] = f["growback_reform_s"] = f["newcomer_boot_s"] = None
            f["newcomer_start_after_interrupt_s"] = None
            born = first(inside, lambda r: r["ev"] == "start")
            if born:
                up = first(inside, lambda r: r["ev"] == "init" and r["pid"] == born["pid"])
                f["newcomer_boot_s"] = up and up["t"] - born["t"]
            if intr:
                formed = first(inside, lambda r: r["ev"] == "re-formed" and r["t"] >= intr["t"])
                f["growback_reform_s"] = formed and formed["t"] - intr["t"]
                f["newcomer_start_after_interrupt_s"] = born and born["t"] - intr["t"]
                before = [r for r in steps if r["t"] <= intr["t"]]
                again = rank0("restored", intr["t"])
                nxt = again and first([r for r in steps if r["t"] > intr["t"]],
                                      lambda r: r["t"] - r["dur"] >= again["t"] - 1e-3)
                if before and nxt:
                    f["growback_pause_s"] = nxt["t"] - nxt["dur"] - before[-1]["t"]
                    if f["lost_s"] is not None:
                        f["lost_s"] += f["growback_pause_s"]
        fails.append(f)
    res["failures"] = fails
    res["kills"] = len(kills)
    res["new_processes"] = sum(1 for r in starts if t0 < r["t"] <= t1)
    # commit / checkpoint overhead: the pause after a step that ends in one
    # against the pause after other steps, outside the failures.
    gaps_c, gaps_o = [], []
    for a_, b_ in zip(steps, steps[1:]):
        if b_["step"] != a_["step"] + 1 or any(a_["t"] < k["t"] <= b_["t"] for k in kills):
            continue
        g = b_["t"] - b_["dur"] - a_["t"]
        (gaps_c if (a_["step"] + 1) % run.get("commit_every", 10) == 0 else gaps_o).append(g)
    res["commit_pause_p50_s"] = pct(gaps_c, 50)
    res["other_pause_p50_s"] = pct(gaps_o, 50)
    return res


# ---------------------------------------------------------------- the report


def fmt(v, d=2):
    return "-" if v is None else ("%.*f" % (d, v))


def pair(values, d=2):
    return "%s / %s" % (fmt(pct(values, 50), d), fmt(pct(values, 99), d))


def label(impl, period):
    return "%s, %s" % ("kolo elastic" if impl == "kolo" else "torchrun", "no failures" if not period
                       else "1 kill / %g s" % period)


def summarise(results, a):
    groups = {}
    for r in results:
        groups.setdefault((r["impl"], r["period"]), []).append(r)
    order = sorted(groups, key=lambda k: (-(k[1] or 1e9), k[0] != "kolo"))
    summary = []
    for key in order:
        rs = groups[key]
        fs = [f for r in rs for f in r["failures"]]
        ok = [f for f in fs if f["recovered"]]
        ref = [x for x in results if x["impl"] == key[0] and not x["period"] and x.get("samples_per_s")]
        ettrs = [r["ettr"] for r in rs if r["ettr"] is not None]
        sps = [r.get("samples_per_s") for r in rs if r.get("samples_per_s")]
        ref_sps = pct([x["samples_per_s"] for x in ref], 50)
        summary.append({
            "impl": key[0], "period": key[1], "label": label(*key), "runs": len(rs),
            "ettr": pct(ettrs, 50), "ettr_min": min(ettrs) if ettrs else None,
            "ettr_max": max(ettrs) if ettrs else None,
            "samples_per_s": pct(sps, 50),
            "vs_own_reference": (pct(sps, 50) / ref_sps) if (sps and ref_sps) else None,
            "window_s": sum(r.get("window_s", 0) for r in rs),
            "kills": sum(r.get("kills", 0) for r in rs), "recovered": len(ok),
            "not_interrupted": sum(1 for f in fs if not f["interrupted"]),
            "steps_counted": sum(r["steps_counted"] for r in rs),
            "steps_redone": sum(r["steps_redone"] for r in rs),
            "new_processes": sum(r.get("new_processes", 0) for r in rs),
            "startup_s": pct([r.get("startup_s") for r in rs], 50),
            "step_p50_s": pct([r.get("step_p50_s") for r in rs], 50),
            "commit_pause_p50_s": pct([r.get("commit_pause_p50_s") for r in rs], 50),
            "other_pause_p50_s": pct([r.get("other_pause_p50_s") for r in rs], 50),
            "load1": pct([r["load1_end"] for r in rs], 50),
            **{k: [f[k] for f in ok] for k in ("lost_s", "detect_s", "reform_s", "restore_s", "redone_s",
                                              "to_first_step_s", "survivor_error_s")},
            "back_to_full_s": [f.get("back_to_full_s") for f in ok] if key[0] == "kolo" else [],
            "growback_pause_s": [f.get("growback_pause_s") for f in ok] if key[0] == "kolo" else [],
            **{k: [f.get(k) for f in ok] if key[0] == "kolo" else [] for k in (
                "growback_reform_s", "newcomer_boot_s", "newcomer_start_after_interrupt_s")},
        })
    return summary


def targets(summary):
    get = lambda impl, p: next((s for s in summary if s["impl"] == impl and s["period"] == p), None)
    out = []
    k60, t60, k15 = get("kolo", 60), get("torchrun", 60), get("kolo", 15)
    if k60 and k60["ettr"] is not None:
        ok = k60["ettr"] >= 0.97 and (t60 is None or t60["ettr"] is None or k60["ettr"] > t60["ettr"])
        out.append("ETTR at one kill per 60 s >= 0.97 and above torchrun's: %s (%s against %s)"
                   % ("met" if ok else "NOT met", fmt(k60["ettr"], 3), fmt(t60 and t60["ettr"], 3)))
    if k15 and k15["ettr"] is not None:
        out.append("ETTR at one kill per 15 s >= 0.90: %s (%s)" % ("met" if k15["ettr"] >= 0.90 else "NOT met",
                                                                 fmt(k15["ettr"], 3)))
    return out


def markdown(summary, a, machine, wall):
    md = ["# Goodput under failures: kolo elastic against torchrun", "",
          "%s, %d CPUs (%s), torch %s, load1 %s..%s; np 4 on one host, the synthetic CNN "
          "(%dx%d images, batch %d per worker, 1 torch thread), commit / checkpoint every %d steps; "
          "W = %g s per configuration, %d repetition(s), seed %d, %d s in all."
          % (machine["utc"], machine["cpus"], machine["cpu"], machine["torch"], fmt(machine["load1_min"], 1),
             fmt(machine["load1_max"], 1), a.image_size, a.image_size, a.batch_size, a.commit_every,
             a.window, a.reps, a.seed, wall), "",
          "| configuration | kills | ETTR | samples/s | steps counted | redone | "
          "lost per failure p50 / p99 s | kill -> back at 4 workers p50 / p99 s |",
          "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        rng = "" if s["runs"] < 2 else " (%s..%s)" % (fmt(s["ettr_min"], 3), fmt(s["ettr_max"], 3))
        back = pair(s["back_to_full_s"]) if s["impl"] == "kolo" else (pair(s["to_first_step_s"]) if s["period"] else "-")
        md.append("| %s | %d | %s%s | %s | %d | %d | %s | %s |" % (
            s["label"], s["kills"], fmt(s["ettr"], 3), rng, fmt(s["samples_per_s"], 0),
            s["steps_counted"], s["steps_redone"],
            pair(s["lost_s"]) if s["period"] else "-", back))
    md += ["", "Time lost per failure, p50 / p99 in seconds (failures the job recovered from before the next kill):", "",
           "| configuration | recovered | detect | re-form | restore | redone steps | kill -> first step | "
           "grow-back pause |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if not s["period"]:
            continue
        md.append("| %s | %d of %d | %s | %s | %s | %s | %s | %s |" % (
            s["label"], s["recovered"], s["kills"], pair(s["detect_s"]), pair(s["reform_s"]), pair(s["restore_s"]),
            pair(s["redone_s"]), pair(s["to_first_step_s"]),
            pair(s["growback_pause_s"]) if s["impl"] == "kolo" else "-"))
    for s in summary:
        if s["impl"] == "kolo" and s["period"] and s["growback_reform_s"]:
            md += ["", "%s, the grow-back (p50 / p99 s): HostsUpdatedInterrupt -> the generation of 4 formed %s; "
                   "the replacement process started %s after the interrupt and took %s from its start to "
                   "hvd.init() returning." % (s["label"], pair(s["growback_reform_s"]),
                                             pair(s["newcomer_start_after_interrupt_s"]), pair(s["newcomer_boot_s"]))]
    md += ["", "| configuration | start-up s (not in W) | step p50 s | pause after a commit / other step p50 ms | "
           "new processes in W | load1 |", "|---|---|---|---|---|---|"]
    for s in summary:
        md.append("| %s | %s | %s | %s / %s | %d | %s |" % (
            s["label"], fmt(s["startup_s"], 1), fmt(s["step_p50_s"], 3),
            fmt(s["commit_pause_p50_s"] and s["commit_pause_p50_s"] * 1e3, 1),
            fmt(s["other_pause_p50_s"] and s["other_pause_p50_s"] * 1e3, 1), s["new_processes"], fmt(s["load1"], 1)))
    md += ["", "samples/s moves with the machine's load from run to run (the step p50 above); ETTR, a ratio of "
           "times within one run, is the figure to compare.", ""]
    md += ["ETTR: the durations of the steps that count (the last execution of each step number) / W; "
           "W opens when rank 0 starts its first step. detect: kill -> kolo: a survivor's collective fails; "
           "torchrun: its agent has started new workers. re-form: -> kolo's new generation is up / "
           "torchrun's init_process_group returned. restore: -> the state is in place (kolo: broadcast from "
           "rank 0; torchrun: checkpoint loaded before init, DDP wrap). lost: last step before the kill -> "
           "first step after the restore, plus the redone steps, plus (kolo) the grow-back pause: the reset "
           "without rollback that takes the replacement worker in (last step before it -> first step after it).", ""]
    md += ["Targets (issue 32): " + "; ".join(targets(summary) or ["-"]) + "."]
    return "\n".join(md) + "\n"


def machine_info(results):
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        cpu = platform.processor()
    try:  # the installed version, without importing torch (seconds)
        from importlib.metadata import version
        torch = version("torch")
    except Exception:  # noqa: B902 - a missing or odd distribution only costs the label
        torch = "?"
    loads = [x for r in results for x in (r["load1_start"], r["load1_end"])]
    return {"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "cpu": cpu,
            "torch": torch, "load1_min": min(loads) if loads else None, "load1_max": max(loads) if loads else None}


def smoke_check(results):
    bad = []
    for r in results:
        f = r["failures"]
        if r["kills"] != 1:
            bad.append("%s: %d kills found in the log, expected 1%s" % (r["name"], r["kills"],
                                                                        " (%s)" % r["note"] if r["note"] else ""))
        elif not f[0]["interrupted"]:
            bad.append("%s: the kill was not detected" % r["name"])
        elif not f[0]["recovered"] or f[0]["steps_after"] < 3:
            bad.append("%s: %d steps after the recovery, expected at least 3" % (r["name"], f[0]["steps_after"]))
    return bad


def interrupted(signum, frame):
    raise KeyboardInterrupt()


def reanalysed(a):
    """The runs of an earlier invocation (its raw directory), analysed again from their event logs."""
    with open(os.path.join(a.reanalyse, "report.json")) as f:
        old = json.load(f)
    c = old["config"]
    a.window, a.periods, a.seed, a.reps, a.impls = c["window_s"], c["periods_s"], c["seed"], c["reps"], c["impls"]
    a.commit_every, a.batch_size, a.image_size, a.stamp = (c["commit_every"], c["batch_size"], c["image_size"],
                                                           old["stamp"])
    runs = []
    for prev in old["runs"]:
        path = os.path.join(a.reanalyse, prev["name"], "events.jsonl")
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        ev = lambda kind: next((r for r in recs if r["ev"] == kind), None)
        window, launch, stop = ev("window"), ev("launch"), ev("stop")
        run = {"name": prev["name"], "rep": prev["rep"], "impl": prev["impl"], "period": prev["period"],
               "dir": os.path.dirname(path), "launch": launch["t"], "t0": window and window["start"],
               "end": window and window["end"], "stop": stop and stop["t"], "note": prev.get("note", ""),
               "load1_start": prev["load1_start"], "load1_end": prev["load1_end"], "records": recs,
               "commit_every": a.commit_every}
        if window and stop and stop["t"] < window["end"]:
            run["end"] = stop["t"]  # a smoke run ends early
        runs.append((run, analyse(run, a.batch_size)))
    a.smoke = old["smoke"]
    return runs, old["wall_s"], old["machine"]


def main():
    a = parse()
    if a.reanalyse:
        runs, wall, machine = reanalysed(a)
        return report(a, a.reanalyse, [res for _, res in runs], wall, machine)
    raw = a.raw or os.path.join(os.environ.get("KOLO_BUILD_DIR") or os.path.join(ROOT, "build"),
                                "bench-peers", "raw", a.stamp + "-goodput" + ("-smoke" if a.smoke else ""))
    os.makedirs(raw, exist_ok=True)
    configs = [(impl, p) for p in ([] if a.smoke else [0.0]) + (a.periods if not a.smoke else [5.0])
               for impl in a.impls]
    say("seed %d, W %g s, %d rep(s) of %s, files in %s"
        % (a.seed, a.window, a.reps, ", ".join("%s %s" % (i, "1 kill / %g s" % p if p else "no failures")
                                                for i, p in configs), raw))
    # A SIGTERM (ctest's timeout, a CI runner) unwinds like ^C, so the
    # launcher of the run in progress and its workers are stopped.
    signal.signal(signal.SIGTERM, interrupted)
    wall0 = time.time()
    runs = []
    try:
        for rep in range(a.reps):
            k = rep % len(configs)
            for impl, period in configs[k:] + configs[:k]:
                run = run_config(a, rep, impl, period, raw)
                run["commit_every"] = a.commit_every
                res = analyse(run, a.batch_size)
                runs.append((run, res))
                say("%s: ETTR %s, %d steps counted, %d redone, %d kills, lost %s s"
                    % (run["name"], fmt(res["ettr"], 3), res["steps_counted"], res["steps_redone"],
                       res.get("kills", 0), ", ".join(fmt(f["lost_s"]) for f in res["failures"])))
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    return report(a, raw, [res for _, res in runs], int(time.time() - wall0))


def report(a, raw, results, wall, machine=None):
    """Prints the tables, writes them (and the smoke verdict); the exit code."""
    summary = summarise(results, a)
    machine = machine or machine_info(results)
    doc = {"bench": "goodput", "stamp": a.stamp, "machine": machine, "smoke": a.smoke,
           "config": {"np": NP, "window_s": a.window, "periods_s": a.periods, "seed": a.seed, "reps": a.reps,
                      "impls": a.impls, "commit_every": a.commit_every, "batch_size": a.batch_size,
                      "image_size": a.image_size, "model": "cnn"},
           "wall_s": wall, "targets": targets(summary), "summary": summary, "runs": results}
    md = markdown(summary, a, machine, wall)
    print(md)
    with open(os.path.join(raw, "report.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if a.smoke:
        bad = smoke_check(results)
        for b in bad:
            say("FAIL " + b)
        say("smoke %s in %d s (files in %s)" % ("failed" if bad else "passed", wall, raw))
        return 1 if bad else 0
    os.makedirs(a.results, exist_ok=True)
    base = os.path.join(a.results, a.stamp + "-goodput")
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(md)
    say("wrote %s.{json,md}" % base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
