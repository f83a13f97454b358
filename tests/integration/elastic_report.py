#!/usr/bin/python3
"""elastic_report.py - the figures of an elastic fault test, and its checks.

Reads the output of `kolo run` (the lines tests/python/elastic_worker.py
prints), the faults the test injected (FAULT lines it wrote, or the
workers' own KILL lines) and the job's generations from the REST API, and
prints for the run:

  resets survived / attempted   a reset is survived when the job trained
                                again after it (a STEP line of a later or
                                equal generation)
  steps lost, per fault         the last step printed before the first
                                reset after the fault, minus the step the
                                survivors resumed at
  time to detect, per fault     fault -> the next generation formed
  time to recover, per fault    fault -> the first step of that generation
  final weights                 equal to a fault-free run of as many steps

Exit status 1 when a check fails (each failure is printed), else 0. The
last line is `RESULT {json}` for tools that collect the figures.

    elastic_report.py --name NAME --out run.out --gens gens.json
                      [--faults faults.log] [--kills] [--commit K]
                      [--max-lost N] [--max-detect S] [--max-recover S]
                      [--check-final] [--seed N] [--orphans N]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(os.path.dirname(HERE), "python", "elastic_worker.py")
SELF_RESET = re.compile(r"^rank \d+ reset and asked for a new generation")
LINE = re.compile(r"^\[\d+\]<stdout>:(STEP|RESET|KILL|FINAL) (.*)$")


def parse_out(path):
    """STEP, RESET and KILL records as dicts, in time order; FINAL lines."""
    recs, finals, seen, twice = [], [], set(), []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            # every STEP, RESET and KILL line carries its time: the same
            # line twice means kolo run printed a line of the job twice
            if m.group(1) != "FINAL":
                if line in seen:
                    twice.append(line.rstrip("\n"))
                seen.add(line)
            kind, rest = m.group(1), m.group(2)
            if kind == "FINAL":
                step, w = rest.split(" ", 1)
                finals.append((int(step), json.loads(w)))
                continue
            words = rest.split()
            r = {"kind": kind}
            # STEP and KILL lines start with a number, then key value pairs
            for k in range(0 if kind == "RESET" else 1, len(words) - 1, 2):
                r[words[k]] = words[k + 1]
            for k in ("step", "size", "gen", "rank"):
                if k in r:
                    r[k] = int(r[k])
            if kind == "STEP":
                r["step"] = int(words[0])
            r["t"] = float(r["t"])
            recs.append(r)
    recs.sort(key=lambda r: r["t"])
    return recs, finals, twice


def parse_faults(path):
    out = []
    if not path or not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 3 and w[0] == "FAULT":
                out.append({"name": w[1], "t": float(w[2]), "detail": " ".join(w[3:])})
    return out


def pct(v, p):
    if not v:
        return None
    if p == 50:
        return statistics.median(v)
    s = sorted(v)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def fmt(v):
    return "-" if v is None else "%.3f" % v


def reference(steps):
    p = subprocess.run([sys.executable, WORKER, "--reference", "--steps", str(steps)],
                       stdout=subprocess.PIPE, universal_newlines=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in p.stdout.splitlines():
        if line.startswith("FINAL "):
            return json.loads(line.split(" ", 2)[2])
    raise RuntimeError("the reference run printed no FINAL line")


def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gens", required=True)
    ap.add_argument("--faults", default="")
    ap.add_argument("--kills", action="store_true", help="the faults are the workers' KILL lines")
    ap.add_argument("--commit", type=int, default=5)
    ap.add_argument("--max-lost", type=int, default=None, help="default: the commit interval")
    ap.add_argument("--max-detect", type=float, default=None)
    ap.add_argument("--max-recover", type=float, default=None)
    ap.add_argument("--no-change", default="", help="fault names that must cause no generation")
    ap.add_argument("--check-final", action="store_true")
    ap.add_argument("--seed", default="")
    ap.add_argument("--orphans", type=int, default=None)
    ap.add_argument("--json", default="", help="also write the result here")
    ap.add_argument("--full", type=int, default=0,
                    help="also time each fault -> the first step at this size again")
    a = ap.parse_args()
    max_lost = a.commit if a.max_lost is None else a.max_lost
    no_change = set(x for x in a.no_change.split(",") if x)

    recs, finals, twice = parse_out(a.out)
    with open(a.gens) as f:
        g = json.load(f)
    gens = sorted(g["generations"], key=lambda x: x["generation"])
    current = g["current"]
    steps = [r for r in recs if r["kind"] == "STEP"]
    resets = [r for r in recs if r["kind"] == "RESET"]
    if a.kills:
        faults = [{"name": "worker_kill", "t": r["t"], "detail": "step %s rank %s wid %s"
                   % (r["step"], r["rank"], r["wid"])} for r in recs if r["kind"] == "KILL"]
    else:
        faults = parse_faults(a.faults)
    errors = []
    if twice:
        errors.append("kolo run printed %d line(s) of the job twice, e.g. %s" % (len(twice), twice[0]))

    # resets survived / attempted
    attempted = max(0, current - 1)
    last_gen_trained = max([r["gen"] for r in steps], default=0)
    if finals:
        # the job reached its end: a generation formed at the last commit
        # (a grow after the last step) has nothing left to train
        last_gen_trained = current
    survived = sum(1 for x in range(2, current + 1) if last_gen_trained >= x)

    rows = []
    for i, ft in enumerate(faults):
        t = ft["t"]
        nxt = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        row = {"fault": ft["name"], "t": t, "detail": ft["detail"]}
        # A generation a survivor asked for on its own (it saw a dead peer
        # before the coordinator did) keeps the members: not the detection.
        gen = next((x for x in gens if x["ts_ms"] / 1000.0 >= t - 0.002
                    and not SELF_RESET.match(x["cause"])), None)
        if ft["name"] in no_change:
            if gen is not None and gen["ts_ms"] / 1000.0 < nxt:
                errors.append("%s at %.3f changed the membership: generation %d (%s)"
                              % (ft["name"], t, gen["generation"], gen["cause"]))
            row["generation"] = None
            rows.append(row)
            continue
        if gen is None or gen["ts_ms"] / 1000.0 >= nxt + 0.002:
            errors.append("%s at %.3f: no new generation before the next fault" % (ft["name"], t))
            rows.append(row)
            continue
        row["generation"] = gen["generation"]
        row["size"] = gen["size"]
        row["cause"] = gen["cause"]
        row["detect_s"] = gen["ts_ms"] / 1000.0 - t
        first = next((r for r in steps if r["gen"] >= gen["generation"] and r["t"] > t), None)
        if first is None:
            errors.append("%s at %.3f: the job never trained in generation %d"
                          % (ft["name"], t, gen["generation"]))
        else:
            row["recover_s"] = first["t"] - t
        if a.full:
            back = next((r for r in steps if r["gen"] >= gen["generation"] and r["t"] > t
                         and r["size"] >= a.full), None)
            if back is not None:
                row["regrow_s"] = back["t"] - t
        reset = next((r for r in resets if r["t"] > t), None)
        if reset is not None:
            before = [r["step"] for r in steps if r["t"] <= reset["t"] and r["gen"] < reset["gen"]]
            if before:
                row["steps_lost"] = max(before) - reset["step"]
        rows.append(row)

    lost = [r["steps_lost"] for r in rows if "steps_lost" in r]
    detect = [r["detect_s"] for r in rows if "detect_s" in r]
    recover = [r["recover_s"] for r in rows if "recover_s" in r]
    regrow = [r["regrow_s"] for r in rows if "regrow_s" in r]

    print("== elastic %s%s" % (a.name, " (seed %s)" % a.seed if a.seed else ""))
    for r in rows:
        print("  fault %-14s at %.3f %-22s -> gen %s size %s detect %s s, recover %s s, "
              "steps lost %s%s" % (r["fault"], r["t"], r["detail"][:22], r.get("generation", "-"),
                                  r.get("size", "-"), fmt(r.get("detect_s")),
                                  fmt(r.get("recover_s")), r.get("steps_lost", "-"),
                                  "  [%s]" % r["cause"][:70] if r.get("cause") else ""))
    sizes = []
    for r in steps:
        if not sizes or sizes[-1] != r["size"]:
            sizes.append(r["size"])
    print("  generations: %d (%s)" % (current, ", ".join("%d:%d" % (x["generation"], x["size"])
                                                         for x in gens)))
    print("  worker sizes over time: %s" % sizes)
    print("  resets survived/attempted: %d/%d" % (survived, attempted))
    print("  steps lost: %s (max %s, commit interval %d)" % (lost, max(lost) if lost else "-",
                                                            a.commit))
    print("  time to detect s: p50 %s max %s" % (fmt(pct(detect, 50)), fmt(max(detect) if detect else None)))
    print("  time to recover s: p50 %s max %s" % (fmt(pct(recover, 50)), fmt(max(recover) if recover else None)))
    if a.full:
        print("  time back to %d workers s: p50 %s max %s" % (a.full, fmt(pct(regrow, 50)),
                                                           fmt(max(regrow) if regrow else None)))
    if a.orphans is not None:
        print("  orphan processes: %d" % a.orphans)
        if a.orphans:
            errors.append("%d orphan process(es)" % a.orphans)

    if survived != attempted:
        errors.append("resets survived %d of %d" % (survived, attempted))
    for r in rows:
        if r.get("steps_lost", 0) > max_lost:
            errors.append("%s at %.3f lost %d steps (> %d)" % (r["fault"], r["t"], r["steps_lost"], max_lost))
        # A fault that brings capacity back (a restarted agent) is taken in
        # once the new worker waits in hvd.init() (a spare, coord_elastic.c):
        # the ranks train on meanwhile, so its start-up is not a detection time.
        grow = (r.get("cause") or "").startswith("capacity to grow into")
        if a.max_detect is not None and not grow and r.get("detect_s", 0) > a.max_detect:
            errors.append("%s at %.3f detected after %.3f s (> %.1f)" % (r["fault"], r["t"], r["detect_s"], a.max_detect))
        if a.max_recover is not None and r.get("recover_s", 0) > a.max_recover:
            errors.append("%s at %.3f recovered after %.3f s (> %.1f)" % (r["fault"], r["t"], r["recover_s"], a.max_recover))
    final_ok = None
    if a.check_final:
        if not finals:
            errors.append("no FINAL line")
        else:
            nsteps = {s for s, _ in finals}
            if len(nsteps) != 1:
                errors.append("ranks ended at different steps: %s" % sorted(nsteps))
            if isinstance(finals[0][1], dict):
                # the C worker (elastic_c_worker.c): acc adds each step's
                # number once, so a fault-free lineage ends at S (S - 1) / 2
                bad = [s for s, w in finals if w.get("acc") != s * (s - 1) // 2]
            else:
                ref = reference(finals[0][0])
                bad = [s for s, w in finals if not close(w, ref)]
            final_ok = not bad
            print("  final: %d rank(s) at step %d, %s the fault-free run"
                  % (len(finals), finals[0][0], "equal to" if final_ok else "DIFFERENT FROM"))
            if bad:
                errors.append("%d rank(s) ended with a state unlike a fault-free run" % len(bad))

    result = {"name": a.name, "seed": a.seed, "faults": len(faults),
              "resets_survived": survived, "resets_attempted": attempted,
              "steps_lost": lost, "steps_lost_max": max(lost) if lost else None,
              "commit_interval": a.commit,
              "detect_s": {"p50": pct(detect, 50), "max": max(detect) if detect else None,
                           "all": detect},
              "recover_s": {"p50": pct(recover, 50), "max": max(recover) if recover else None,
                            "all": recover},
              "regrow_s": {"size": a.full, "p50": pct(regrow, 50),
                           "max": max(regrow) if regrow else None, "all": regrow} if a.full else None,
              "faults_detail": rows,
              "orphans": a.orphans, "final_matches": final_ok, "generations": current,
              "errors": errors}
    for e in errors:
        print("  CHECK FAILED: %s" % e)
    print("RESULT " + json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
