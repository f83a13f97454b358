#!/usr/bin/python3
"""Drop-in stress (issue 30, item 2): Horovod-style module sequences
(horovod_style/test_stress.py) run on every rank of a job in seeded random
orders, back to back in one launch, with busy loops beside the job.

    stress_dropin.py [--np 2,3,4] [--seeds 1-20 | --seeds 3,17]
                     [--per-launch K] [--busy 2] [--hosts netns]
                     [--record FILE] [--timeout S]

For each np, the seeds go K to a launch (`kolo run -np N -- python3
suite.py --seed=S1,S2,... test_stress.py`): each seed is one pass over
the module in its own order, in the same processes as the passes before
it, so a pass that fails poisons the next ones if anything is left
behind. Every (np, seed) pass counts: it passes when every rank ran every
test with no failure and no error. `--busy N` keeps N shell busy loops
(`while :; do :; done`) running beside the jobs. `--hosts netns` runs the
job across two network namespaces (needs root): two agents, -H a:k,b:k.
`--record FILE` appends one JSON line per pass (and one summary line) so
a run's seeds and outcomes are kept. The summary is printed at the end;
the exit code is 0 when every pass passed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from conftest import _descendants as descendants  # noqa: E402  (every process below one)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SUITE = os.path.join(HERE, "horovod_style", "suite.py")
MODULE = "test_stress.py"
PY = "/usr/bin/python3"


def parse_seeds(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def kolo_bin():
    return os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")


def busy_loops(n):
    return [subprocess.Popen(["/bin/bash", "-c", "while :; do :; done"]) for _ in range(n)]


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


class Netns:
    """Two network namespaces a and b joined by a veth pair, an agent in
    each and the coordinator in a's (tests/integration's hosts tests do
    the same from the shell)."""

    def __init__(self, work):
        self.work = work
        s = os.getpid() % 100000
        self.ns = ["kolo-sda-%d" % s, "kolo-sdb-%d" % s]
        self.addrs = ["10.217.0.1", "10.217.0.2"]
        self.procs = []
        self.made = []

    def ip(self, *args):
        subprocess.run(["ip"] + list(args), check=True, stdout=subprocess.DEVNULL)

    def up(self, env):
        s = os.getpid() % 100000
        for ns in self.ns:
            self.ip("netns", "add", ns)
            self.made.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        va, vb = "ksa%d" % s, "ksb%d" % s
        self.ip("link", "add", va, "netns", self.ns[0], "type", "veth", "peer", "name", vb,
                "netns", self.ns[1])
        for ns, dev, addr in ((self.ns[0], va, self.addrs[0]), (self.ns[1], vb, self.addrs[1])):
            self.ip("-n", ns, "addr", "add", addr + "/24", "dev", dev)
            self.ip("-n", ns, "link", "set", dev, "up")
        kolo = kolo_bin()
        token = os.path.join(self.work, "token")
        with open(token, "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        os.chmod(token, 0o600)
        self.token = token
        out = os.path.join(self.work, "coord.out")
        # a long lease: a crowded machine must not lose an idle agent
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns[0], kolo, "coordinator", "--listen",
             "tcp://%s:0" % self.addrs[0], "--http", "127.0.0.1:0",
             "--db", os.path.join(self.work, "coord.db"), "--lease", "120s",
             "--token-file", token],
            stdout=open(out, "w"), stderr=open(os.path.join(self.work, "coord.err"), "w"),
            env=env))
        self.url = None
        for _ in range(200):
            with open(out) as f:
                m = re.search(r"rpc=(\S+)", f.read())
            if m:
                self.url = m.group(1)
                break
            time.sleep(0.05)
        if not self.url:
            raise RuntimeError("the coordinator in %s did not start" % self.ns[0])
        for i, (ns, name) in enumerate(zip(self.ns, ("a", "b"))):
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, kolo, "agent", "--coordinator", self.url,
                 "--token-file", token, "--name", name, "--slots", "4",
                 "--state-dir", os.path.join(self.work, "agent-" + name), "--addr",
                 self.addrs[i]],
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(self.work, "agent-%s.log" % name), "w"), env=env))
        time.sleep(3.0)

    def run_cmd(self, np_):
        k = (np_ + 1) // 2
        return ["ip", "netns", "exec", self.ns[0], kolo_bin(), "run", "--coordinator", self.url,
                "--token-file", self.token, "-np", str(np_), "-H", "a:%d,b:%d" % (k, np_ - k)]

    def down(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    for q in descendants(p.pid):
                        try:
                            os.kill(q, signal.SIGKILL)
                        except OSError:
                            pass
                    p.kill()
                    p.wait()
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


_current = []  # the launch running now, killed if the driver is stopped


def kill_tree(p):
    for q in [p.pid] + descendants(p.pid):
        try:
            os.kill(q, signal.SIGKILL)
        except OSError:
            pass


def run_launch(np_, seeds, timeout, work, netns=None):
    """One launch of the module at np_ with `seeds`; returns (rc, output,
    {seed: {"ranks": n, "failed": [...]}}, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    env["PYTHONUNBUFFERED"] = "1"
    env["XDG_STATE_HOME"] = os.path.join(work, "state")
    env.setdefault("OMP_NUM_THREADS", "1")
    if netns:
        head = netns.run_cmd(np_)
    else:
        head = [kolo_bin(), "run", "-np", str(np_)]
    cmd = head + ["--", PY, SUITE, "--seed=" + ",".join(map(str, seeds)), MODULE]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         cwd=work, universal_newlines=True, start_new_session=True)
    _current.append(p)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        out, _ = p.communicate()
        out += "\n[stress] launch timed out after %d s\n" % timeout
    took = time.time() - t0
    result = {s: {"ranks": 0, "failed": []} for s in seeds}
    # unittest's lines say which test failed on which rank; they come
    # before that pass's SUITE line on the same rank
    pending = {}  # rank -> failed tests so far in its pass
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]<std\w+>:(.*)$", line)
        if not m:
            continue
        rank, text = int(m.group(1)), m.group(2)
        s = re.match(r"SUITE rank \d+ seed (\d+): ran (\d+), failures (\d+), errors (\d+)", text)
        if s:
            seed = int(s.group(1))
            if seed in result:
                result[seed]["ranks"] += 1
                if int(s.group(3)) or int(s.group(4)):
                    result[seed]["failed"] += ["%s@%d" % (t, rank) for t in pending.get(rank, [])]
                    if not pending.get(rank):
                        result[seed]["failed"].append("?@%d" % rank)
            pending[rank] = []
            continue
        f = re.match(r"(test_\w+) \(.*\) \.\.\. .*\b(FAIL|ERROR)$", text)
        if f and f.group(1) not in pending.setdefault(rank, []):
            pending[rank].append(f.group(1))  # once, with its tearDown's error too
    for seed in seeds:
        r = result[seed]
        r["passed"] = r["ranks"] == np_ and not r["failed"]
        if r["ranks"] < np_ and not r["failed"]:
            r["failed"].append("ended early (rc %s, %d of %d ranks reported)"
                               % (p.returncode, r["ranks"], np_))
    _current.remove(p)
    return p.returncode, out, result, took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", default="2,3,4")
    ap.add_argument("--seeds", default="1-20")
    ap.add_argument("--per-launch", type=int, default=1)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--hosts", choices=["local", "netns"], default="local")
    ap.add_argument("--record")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per launch")
    ap.add_argument("--keep-output", help="directory for each failed launch's output")
    a = ap.parse_args()
    nps = [int(x) for x in a.np.split(",")]
    seeds = parse_seeds(a.seeds)
    work = tempfile.mkdtemp(prefix="kolo-stress-")

    def stopped(signum, frame):
        raise SystemExit("[stress] stopped by signal %d" % signum)

    signal.signal(signal.SIGTERM, stopped)
    busy = busy_loops(a.busy)
    netns = None
    rows = []
    try:
        if a.hosts == "netns":
            netns = Netns(work)
            netns.up(dict(os.environ))
        for np_ in nps:
            for i in range(0, len(seeds), a.per_launch):
                chunk = seeds[i:i + a.per_launch]
                rc, out, res, took = run_launch(np_, chunk, a.timeout, work, netns)
                for seed in chunk:
                    row = {"np": np_, "seed": seed, "hosts": a.hosts, "busy": a.busy,
                           "passed": res[seed]["passed"], "failed": res[seed]["failed"],
                           "launch_s": round(took, 1), "launch_seeds": chunk}
                    rows.append(row)
                    print("[stress] np %d seed %d: %s%s (launch %.1f s)"
                          % (np_, seed, "pass" if row["passed"] else "FAIL",
                             "" if row["passed"] else " " + ", ".join(row["failed"]), took),
                          flush=True)
                    if a.record:
                        with open(a.record, "a") as f:
                            f.write(json.dumps(row) + "\n")
                if any(not res[s]["passed"] for s in chunk):
                    if a.keep_output:
                        os.makedirs(a.keep_output, exist_ok=True)
                        path = os.path.join(a.keep_output, "np%d-seed%s.log"
                                            % (np_, "-".join(map(str, chunk))))
                        with open(path, "w") as f:
                            f.write(out)
                        print("[stress] output kept in %s" % path, flush=True)
                    else:
                        sys.stdout.write(out)
    finally:
        for p in _current:
            kill_tree(p)
            p.wait()
        stop(busy)
        if netns:
            netns.down()
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in rows if not r["passed"]]
    summary = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hosts": a.hosts,
               "busy": a.busy, "np": nps, "seeds": seeds, "passes": len(rows),
               "passed": len(rows) - len(failed),
               "failed": ["np %d seed %d" % (r["np"], r["seed"]) for r in failed]}
    print("[stress] summary: %d of %d passes passed (np %s, seeds %s, %s, %d busy loops)%s"
          % (summary["passed"], summary["passes"], a.np, a.seeds, a.hosts, a.busy,
             "; failed: " + "; ".join(summary["failed"]) if failed else ""), flush=True)
    if a.record:
        with open(a.record, "a") as f:
            f.write(json.dumps({"summary": summary}) + "\n")
    return 0 if rows and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
