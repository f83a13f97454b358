"""horovodrun's flags as their users run them (issue 30, item 3): what
docs/cli.md's table promises, checked by its effect on a job rather than
by the variables it sets (tests/integration/test_run_flags.sh checks
those, and --hostfile, --output-filename, --config-file, --start-timeout,
--verbose, -cb; test_timeline.py --timeline-filename):

- --stall-check-warning-time-seconds S: an op one rank submits S seconds
  late is reported stalled, naming the late rank (the job's events, which
  the dashboard shows); --no-stall-check: never;
- --stall-check-shutdown-time-seconds S: an op a rank never submits fails
  on the others after about S seconds, naming the rank, instead of
  hanging;
- --log-level: libkolo's own log lines in the workers' output at DEBUG,
  none at ERROR (and none by default, as Horovod's default WARNING
  prints nothing in a clean run).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from conftest import KOLO, PYDIR, kolo_run

WORKER = r'''
import os, sys, time, torch
import kolo.torch as hvd
hvd.init()
mode, late = sys.argv[1], float(sys.argv[2])
t0 = time.time()
if mode == "late":
    if hvd.rank() == 1:
        time.sleep(late)
    hvd.allreduce(torch.ones(2), name="slow.grad")
    print("done after %.1f s" % (time.time() - t0), flush=True)
elif mode == "never":
    if hvd.rank() == 1:
        # never submits slow.grad: waits until rank 0's op has failed (it
        # leaves a file in the job's folder), at most `late` seconds
        while time.time() - t0 < late and not os.path.exists("rank0.ended"):
            time.sleep(0.1)
    else:
        try:
            hvd.allreduce(torch.ones(2), name="slow.grad")
            print("WRONG: it completed", flush=True)
        except hvd.HorovodInternalError as e:
            print("failed after %.1f s: %s" % (time.time() - t0, e), flush=True)
        open("rank0.ended", "w").close()
elif mode == "cachedlate":
    # cached by three rounds first: the late op is agreed by the ranks'
    # readiness rounds, which hand it to the coordinator's stall check
    # after half the warning time
    for _ in range(3):
        hvd.allreduce(torch.ones(2), name="slow.grad")
    hvd.barrier()
    t0 = time.time()
    if hvd.rank() == 1:
        time.sleep(late)
    hvd.allreduce(torch.ones(2), name="slow.grad")
    print("done after %.1f s" % (time.time() - t0), flush=True)
else:
    hvd.allreduce(torch.ones(2), name="grad")
    hvd.barrier()
    print("ran", flush=True)
'''


def _run_watching_events(kolo_args, worker_args, timeout=90):
    """kolo run of WORKER on 2 ranks; returns (rc, stdout, stderr, the
    job's events read from the embedded coordinator's REST API while the
    job ran)."""
    tmp = tempfile.mkdtemp(prefix="kolo-hvdrun-")
    try:
        return _watch(tmp, kolo_args, worker_args, timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _watch(tmp, kolo_args, worker_args, timeout):
    path = os.path.join(tmp, "worker.py")
    with open(path, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, PYTHONPATH=PYDIR, PYTHONUNBUFFERED="1",
               XDG_STATE_HOME=os.path.join(tmp, "state"), OMP_NUM_THREADS="1")
    p = subprocess.Popen([KOLO, "run", "-np", "2"] + kolo_args + ["--", sys.executable, path]
                         + worker_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=tmp, universal_newlines=True)
    err_lines, events = [], {}

    def read_err():
        for line in p.stderr:
            err_lines.append(line)

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    out_box = []
    reader = threading.Thread(target=lambda: out_box.append(p.stdout.read()), daemon=True)
    reader.start()
    end = time.time() + timeout
    url = None
    while p.poll() is None and time.time() < end:
        if url is None:
            m = re.search(r"on the dashboard: (http://[^/\s]+)/\S*#/jobs/(\d+)", "".join(err_lines))
            if m:
                url = "%s/api/v1/jobs/%s/events" % (m.group(1), m.group(2))
        if url:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    body = json.loads(r.read().decode())
                for ev in body if isinstance(body, list) else body.get("events", []):
                    events[json.dumps(ev, sort_keys=True)] = ev
            except (OSError, ValueError):
                pass
        time.sleep(0.3)
    if p.poll() is None:
        p.kill()
    p.wait()
    reader.join(10)
    t.join(10)
    out, err = (out_box[0] if out_box else ""), "".join(err_lines)
    print("--- stdout\n%s\n--- stderr\n%s\n--- events\n%s" % (out, err, list(events.values())))
    return p.returncode, out, err, list(events.values())


def _stalled(events):
    return [e for e in events if "op.stalled" in json.dumps(e)]


@pytest.mark.parametrize("mode", ["late", "cachedlate"])
def test_stall_check_warning_names_the_late_rank(mode):
    rc, out, err, events = _run_watching_events(
        ["--stall-check-warning-time-seconds", "1"], [mode, "4"])
    assert rc == 0, err
    assert out.count("done after") == 2, out
    st = _stalled(events)
    assert st, events
    text = json.dumps(st[0])
    assert "slow.grad" in text and "rank(s) 1" in text, st
    # ... and kolo run says it in the terminal, where users look
    said = [l for l in err.splitlines() if l.startswith("[kolo] stall:")]
    assert said and "slow.grad" in said[0] and "rank(s) 1" in said[0], err


def test_no_stall_check_stays_silent():
    rc, out, err, events = _run_watching_events(
        ["--no-stall-check", "--stall-check-warning-time-seconds", "1"], ["late", "4"])
    assert rc == 0, err
    assert out.count("done after") == 2, out
    assert not _stalled(events), events
    assert "[kolo] stall" not in err, err


def test_stall_shutdown_fails_the_op_instead_of_hanging():
    job = kolo_run(2, WORKER, args=("never", "25"), timeout=90,
                   kolo_args=("--stall-check-shutdown-time-seconds", "3"))
    lines = [l for l in job.lines(0) if l.startswith("failed after")]
    assert lines, job
    secs = float(lines[0].split()[2])
    assert 2.5 <= secs < 15, lines
    assert "stall shutdown" in lines[0] and "slow.grad" in lines[0] and "1" in lines[0], lines
    assert not any("WRONG" in l for l in job.lines()), job


def test_log_level_reaches_libkolo():
    debug = kolo_run(2, WORKER, args=("plain", "0"), timeout=60, kolo_args=("--log-level", "DEBUG"))
    assert debug.rc == 0, debug
    assert re.search(r"^\[0\]<stderr>:\S+ DEBUG kolo: ", debug.err, re.M), debug
    quiet = kolo_run(2, WORKER, args=("plain", "0"), timeout=60, kolo_args=("--log-level", "ERROR"))
    assert quiet.rc == 0, quiet
    assert not re.search(r"^\[\d\]<stderr>:\S+ (DEBUG|INFO|WARN) kolo: ", quiet.err, re.M), quiet
    plain = kolo_run(2, WORKER, args=("plain", "0"), timeout=60)
    assert plain.rc == 0 and plain.lines().count("ran") == 2, plain
    assert not re.search(r"^\[\d\]<stderr>:", plain.err, re.M), plain


STOPPED = r'''
import os, signal, sys, time
import torch
import kolo.torch as hvd
hvd.init()
hvd.allreduce(torch.ones(2), name="before")
if hvd.rank() == 1:
    if os.fork() == 0:      # continues its parent 20 s later, as an operator would
        time.sleep(20)
        os.kill(os.getppid(), signal.SIGCONT)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)
out = hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum)
print("sum", out.tolist())
hvd.shutdown()
'''


def test_a_stopped_rank_is_named_and_the_job_goes_on_when_continued():
    # not elastic: kolo run names the stopped rank and its pid after 8 s
    # (Horovod would only hang); SIGCONT and the job finishes
    job = kolo_run(2, STOPPED, timeout=120)
    assert job.rc == 0, job
    said = re.findall(r"^\[kolo\] rank 1 \(pid (\d+)\) on host \S+ has been stopped by a signal "
                      r"for \d+ s \(SIGSTOP or SIGTSTP; state T\): the other ranks wait on it",
                      job.err, re.M)
    assert len(said) == 1, job.err
    assert job.lines().count("sum [2.0, 2.0]") == 2, job


def test_kolo_run_gives_workers_its_own_package(tmp_path):
    # from a checkout, no PYTHONPATH: the workers import the package of
    # this build (a newcomer's first `kolo run`), not ModuleNotFoundError
    script = tmp_path / "w.py"
    script.write_text("import kolo, kolo.torch as hvd\nhvd.init()\n"
                      "print('from', kolo.__file__)\nhvd.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KOLO_LIBRARY")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    p = subprocess.run([KOLO, "run", "-np", "2", "--", "/usr/bin/python3", str(script)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    want = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                        "python", "kolo", "__init__.py")
    froms = [l.split("from ", 1)[1] for l in p.stdout.splitlines() if "<stdout>:from " in l]
    assert len(froms) == 2 and all(os.path.samefile(f, want) for f in froms), p.stdout
    # a PYTHONPATH that holds a kolo package is the user's choice: kept first
    other = tmp_path / "mine" / "kolo"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise SystemExit('the user kolo')\n")
    env["PYTHONPATH"] = str(tmp_path / "mine")
    p = subprocess.run([KOLO, "run", "-np", "1", "--", "/usr/bin/python3", str(script)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode != 0 and "the user kolo" in p.stderr + p.stdout, (p.stdout, p.stderr)
