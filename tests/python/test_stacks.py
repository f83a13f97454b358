"""kolo stacks (issue 31): what every rank of a running job is doing - its
Python stacks (every thread, the user's own line), its process's state,
and its part in a stall - taken through the agents while the job runs:
a rank blocked in a collective, one asleep in its data loader, one in a
tight loop, one stopped by SIGSTOP."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import KOLO, PYDIR

pytest.importorskip("torch")

WORKER = r'''
import os, sys, time
import torch
import kolo.torch as hvd
hvd.init()
role = sys.argv[1 + hvd.rank()]

def load_batch():            # a data loader that never returns
    print("READY", hvd.rank(), os.getpid(), flush=True)
    time.sleep(120)

def spin():
    print("READY", hvd.rank(), os.getpid(), flush=True)
    while True:              # a tight Python loop
        pass

if role == "loader":
    load_batch()
elif role == "spin":
    spin()
elif role == "bcast":        # a broadcast the other rank never makes
    print("READY", hvd.rank(), os.getpid(), flush=True)
    hvd.broadcast(torch.ones(2), root_rank=0, name="model.weight")   # BCAST LINE
else:
    print("READY", hvd.rank(), os.getpid(), flush=True)
    hvd.allreduce(torch.ones(2), name="layer4.weight")   # USER LINE
hvd.shutdown()
'''


class Job:
    """A kolo run in the background; its coordinator and token from the
    first lines, READY lines from its ranks."""

    def __init__(self, tmp_path, roles, flags=()):
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        self.script = str(script)
        env = dict(os.environ, PYTHONPATH=PYDIR, PYTHONUNBUFFERED="1",
                   XDG_STATE_HOME=str(tmp_path / "state"), OMP_NUM_THREADS="1")
        self.p = subprocess.Popen([KOLO, "run", "-np", str(len(roles))] + list(flags) +
                                  ["--", sys.executable,
                                   self.script] + roles, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)
        self.ready, self.url, self.token, self.err = {}, None, None, []
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._errs, daemon=True).start()

    def _out(self):
        for line in self.p.stdout:
            m = re.search(r"<stdout>:READY (\d+) (\d+)", line)
            if m:
                self.ready[int(m.group(1))] = int(m.group(2))

    def _errs(self):
        for line in self.p.stderr:
            self.err.append(line)
            m = re.search(r"embedded coordinator (tcp://[^,]+),.* token ([^)]+)\)", line)
            if m:
                self.url, self.token = m.group(1), m.group(2)
            m = re.search(r"dashboard (http://[^/]+)/\?key=(\w+)", line)
            if m and not getattr(self, "http", None):
                self.http, self.key = m.group(1), m.group(2)

    def wait_err(self, pattern, timeout=60):
        """The first [kolo] line of kolo run's that matches pattern."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.err):
                if re.search(pattern, line):
                    return line
            time.sleep(0.1)
        raise AssertionError("no line like %r in:\n%s" % (pattern, "".join(self.err)))

    def wait_ready(self, n, timeout=90):
        deadline = time.time() + timeout
        while (len(self.ready) < n or not self.url) and time.time() < deadline:
            time.sleep(0.2)
        assert len(self.ready) == n and self.url, "".join(self.err)
        time.sleep(1.0)  # past the READY print, into the wait

    def stacks(self, *args):
        t0 = time.time()
        p = subprocess.run([KOLO, "stacks", "--coordinator", self.url, "--token-file",
                            self.token] + list(args) + ["1"], capture_output=True, text=True,
                           timeout=30)
        return p, time.time() - t0

    def close(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in self.ready.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait(30)


def _ranks(p):
    assert p.returncode == 0, p.stderr
    return {r["rank"]: r for r in json.loads(p.stdout)["ranks"]}


def test_blocked_in_a_collective_and_asleep_in_the_loader(tmp_path):
    job = Job(tmp_path, ["loader", "reduce"])
    try:
        job.wait_ready(2)
        p, took = job.stacks("-o", "json")
        got = _ranks(p)
        assert took < 5, took
        r0, r1 = got[0], got[1]
        # rank 0: the user's data loader, and it never submitted the op
        assert r0["answered"] and "in load_batch" in r0["stacks"], r0
        assert "never submitted 'layer4.weight'" in r0["pending"], r0
        assert r0["state"].startswith("S"), r0
        # rank 1: blocked in allreduce, the user's line that called it
        line = WORKER.splitlines().index(
            [l for l in WORKER.splitlines() if "USER LINE" in l][0]) + 1
        assert r1["answered"] and ('"%s", line %d in <module>' % (job.script, line)) in r1["stacks"], r1
        assert "waits in 'layer4.weight'" in r1["pending"], r1
        assert r0["pid"] == job.ready[0] and r1["pid"] == job.ready[1]
        # for a person: a header a rank, then its stack
        p, _ = job.stacks("--rank", "0")
        assert p.returncode == 0 and p.stdout.startswith("rank 0  host ") and \
            "in load_batch" in p.stdout and "rank 1 " not in p.stdout, p.stdout
    finally:
        job.close()


def test_a_tight_loop_and_a_stopped_rank(tmp_path):
    # np 4: a loop, a loader and two ranks blocked in the allreduce
    job = Job(tmp_path, ["spin", "reduce", "loader", "reduce"])
    try:
        job.wait_ready(4)
        got = _ranks(job.stacks("-o", "json")[0])
        assert sorted(got) == [0, 1, 2, 3], got
        assert got[0]["answered"] and "in spin" in got[0]["stacks"], got[0]
        assert got[0]["state"].startswith("R"), got[0]
        assert got[2]["answered"] and "in load_batch" in got[2]["stacks"], got[2]
        for r in (1, 3):
            assert got[r]["answered"] and "waits in 'layer4.weight'" in got[r]["pending"], got[r]
        os.kill(job.ready[1], signal.SIGSTOP)
        time.sleep(0.3)
        p, took = job.stacks("-o", "json")
        got = _ranks(p)
        # a stopped process cannot answer: its state from /proc, within the wait
        assert not got[1]["answered"] and got[1]["state"].startswith("T"), got[1]
        assert took < 8, took
        assert got[0]["answered"] and "in spin" in got[0]["stacks"], got[0]
        assert got[3]["answered"], got[3]
    finally:
        job.close()


def test_a_job_that_is_not_running(tmp_path):
    job = Job(tmp_path, ["reduce"])
    try:
        job.wait_ready(1)
        job.p.wait(60)
        # the embedded coordinator is gone with kolo run: refused, exit 1
        p, _ = job.stacks()
        assert p.returncode != 0 and p.stderr, (p.returncode, p.stdout, p.stderr)
    finally:
        job.close()


def _rest(url, key, method="GET"):
    req = urllib.request.Request(url, method=method,
                                 headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stall_verdict_names_collectives_that_never_match(tmp_path):
    """Ranks blocked in collectives of different names (a broadcast on one
    rank where the others allreduce, as a broadcast_parameters outside
    hvd.elastic.run meets the others' state sync): kolo run's stall
    verdict says they can never match and names the user's line."""
    job = Job(tmp_path, ["bcast", "reduce"], ["--stall-check-warning-time-seconds", "2"])
    lines = WORKER.splitlines()
    bcast_line = next(i for i, l in enumerate(lines) if "# BCAST LINE" in l) + 1
    reduce_line = next(i for i, l in enumerate(lines) if "# USER LINE" in l) + 1
    try:
        job.wait_ready(2)
        stall = job.wait_err(r"\[kolo\] at the stall: ", 40)
        assert "which can never match" in stall, stall
        m = re.search(r"rank (\d) \(host [^)]+\) waits in '([\w.]+)' instead, which the others "
                      r"never submit \(the ranks run different collectives, which can never "
                      r"match\): worker.py:(\d+) in <module>", stall)
        assert m, stall
        rank, other, line = int(m.group(1)), m.group(2), int(m.group(3))
        want = {0: ("model.weight", bcast_line), 1: ("layer4.weight", reduce_line)}[rank]
        assert (other, line) == want, stall
        os.kill(job.p.pid, signal.SIGINT)
        assert job.p.wait(40) != 0
    finally:
        job.close()


def test_stall_and_stop_verdicts_kept_with_the_job(tmp_path):
    """The stall warning takes every rank's stacks and kolo run prints a
    verdict naming the rank that never came and its line; an interrupted
    kolo run takes them again before the ranks are stopped; both stay in
    the run's database, where kolo stacks and REST find them after the
    job ended."""
    job = Job(tmp_path, ["loader", "reduce"], ["--stall-check-warning-time-seconds", "2"])
    loader_line = WORKER.splitlines().index("    time.sleep(120)") + 1
    try:
        job.wait_ready(2)
        stall = job.wait_err(r"\[kolo\] at the stall: ", 40)
        assert re.search(r"rank 1 \(host [^)]+\) waits in 'layer4.weight' for \d+ s", stall), stall
        assert re.search(r"rank 0 \(host [^)]+\) never submitted it: worker.py:%d in load_batch"
                         % loader_line, stall), stall
        # on request through REST: 202, then kept
        code, body = _rest(job.http + "/api/v1/jobs/1/stacks", job.key, "POST")
        assert code == 202 and body["taking"], body
        deadline = time.time() + 15
        while time.time() < deadline:
            code, body = _rest(job.http + "/api/v1/jobs/1/stacks", job.key)
            assert code == 200, body
            if any(s["reason"] == "on request (REST)" for s in body["stacks"]):
                break
            time.sleep(0.3)
        kept = [s for s in body["stacks"] if s["reason"] == "on request (REST)"]
        assert kept and len(kept[0]["ranks"]) == 2, body
        assert "in load_batch" in kept[0]["ranks"][0]["stacks"], kept[0]
        assert _rest(job.http + "/api/v1/jobs/1/stacks", "")[0] == 401
        # interrupted: the stacks come first, then the stop
        os.kill(job.p.pid, signal.SIGINT)
        stop = job.wait_err(r"\[kolo\] when stopped \(interrupted by signal 2 in kolo run\): ", 40)
        assert "never submitted it: worker.py:%d in load_batch" % loader_line in stop, stop
        assert job.p.wait(40) != 0
    finally:
        job.close()
    # the run's database keeps them: a coordinator on it answers kolo stacks
    db = glob.glob(str(tmp_path / "state" / "kolo" / "runs" / "*.db"))
    assert len(db) == 1, db
    port, hport = _free_port(), _free_port()
    coord = subprocess.Popen([KOLO, "coordinator", "--db", db[0], "--listen",
                              "tcp://127.0.0.1:%d" % port, "--http", "127.0.0.1:%d" % hport],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = "tcp://127.0.0.1:%d" % port
        deadline = time.time() + 20
        while True:
            p = subprocess.run([KOLO, "stacks", "--coordinator", url, "1"], capture_output=True,
                               text=True, timeout=30)
            if p.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.3)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("the job's last stacks, taken by kolo when stopped "
                                   "(interrupted by signal 2 in kolo run), "), p.stdout
        assert "verdict: rank 1 (host " in p.stdout and "in load_batch" in p.stdout, p.stdout
        p = subprocess.run([KOLO, "stacks", "--coordinator", url, "-o", "json", "1"],
                           capture_output=True, text=True, timeout=30)
        got = json.loads(p.stdout)
        assert got["kept"] and got["verdict"].startswith("rank 1 "), got
        key = open(db[0] + ".dashboard").read().split("key=")[1].split("#")[0].strip()
        code, body = _rest("http://127.0.0.1:%d/api/v1/jobs/1/stacks" % hport, key)
        assert code == 200 and not body["taking"], body
        reasons = [s["reason"] for s in body["stacks"]]
        assert reasons[0].startswith("when stopped") and "at the stall" in reasons, reasons
    finally:
        coord.terminate()
        coord.wait(20)
