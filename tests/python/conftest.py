"""Shared fixtures for the Python tests.

Every multi-rank test runs a real job: `kolo run -np N` with an embedded
coordinator and agent, real worker processes, real shared memory / TCP.
The worker side of a test is a Python file (or source text) run with this
interpreter; it reports failures through its exit code and output.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYDIR = os.path.join(ROOT, "python")
KOLO = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")
# kolo_run's folders (script, state, the job's cwd): a test may still read
# files there after the job, so they go when the session ends
_SCRATCH = []


@pytest.fixture(scope="session", autouse=True)
def _remove_scratch():
    yield
    for d in _SCRATCH:
        shutil.rmtree(d, ignore_errors=True)

if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)


class Job:
    """The outcome of one `kolo run`: exit code and every output line."""

    def __init__(self, rc, out, err):
        self.rc = rc
        self.out = out
        self.err = err

    def lines(self, rank=None):
        """Output lines of one rank (without the "[r]<stdout>:" prefix), or all."""
        res = []
        for line in self.out.splitlines():
            if not line.startswith("["):
                continue
            head, _, text = line.partition(":")
            r = head[1:head.index("]")]
            if rank is None or r == str(rank):
                res.append(text)
        return res

    def __repr__(self):
        return "Job(rc=%d)\n--- stdout\n%s\n--- stderr\n%s" % (self.rc, self.out, self.err)


def kolo_run(np, script, args=(), timeout=120, env=None, kolo_args=(), state_dir=None):
    """Run `script` (a path, or Python source text) on np workers.

    Returns a Job. The workers see PYTHONPATH=<repo>/python and use this
    interpreter; KOLO_LIBRARY is left to the package's own search unless
    the caller's environment sets it.
    """
    tmp = tempfile.mkdtemp(prefix="kolo-pytest-")
    _SCRATCH.append(tmp)
    if "\n" in script:
        path = os.path.join(tmp, "worker.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(script))
    else:
        path = script
    e = dict(os.environ)
    e["PYTHONPATH"] = PYDIR + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PYTHONUNBUFFERED"] = "1"
    e["XDG_STATE_HOME"] = state_dir or os.path.join(tmp, "state")
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    cmd = [KOLO, "run", "-np", str(np)] + list(kolo_args) + ["--", sys.executable, path] + [str(a) for a in args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, cwd=tmp,
                         universal_newlines=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as ex:
        partial = ex.stderr.decode(errors="replace") if isinstance(ex.stderr, bytes) else (ex.stderr or "")
        diag = _diagnose_hang(p.pid, partial)
        for pid in [p.pid] + _descendants(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out, err = p.communicate()
        raise AssertionError("kolo run timed out after %ss\n--- stdout\n%s\n--- stderr\n%s\n%s"
                             % (timeout, out, err, diag))
    # printed in full: pytest shows it (untruncated) when the test fails
    print("$ %s\n--- exit %d\n--- stdout\n%s\n--- stderr\n%s" % (" ".join(cmd), p.returncode,
                                                               out, err))
    return Job(p.returncode, out, err)


def _descendants(pid):
    """Every live process below pid, from /proc."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _diagnose_hang(pid, stderr):
    """What a hung `kolo run` was doing: the job's events from its embedded
    coordinator's REST API and every process' thread stacks (gdb, where
    installed), so a hang that happens once in CI names its wait."""
    import re
    import urllib.request
    parts = []
    m = re.search(r"on the dashboard: (http://[^/\s]+)/(?:\?key=\w+)?#/jobs/(\d+)", stderr)
    if m:
        for path in ("/api/v1/jobs/%s" % m.group(2), "/api/v1/jobs/%s/events" % m.group(2)):
            try:
                with urllib.request.urlopen(m.group(1) + path, timeout=5) as r:
                    parts.append("--- GET %s\n%s" % (path, r.read().decode(errors="replace")))
            except OSError as ex:
                parts.append("--- GET %s: %s" % (path, ex))
    if shutil.which("gdb"):
        procs = [pid] + _descendants(pid)
        gdbs = [(q, subprocess.Popen(["gdb", "-p", str(q), "-batch", "-ex", "thread apply all bt 15"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     universal_newlines=True)) for q in procs]
        for q, g in gdbs:
            try:
                text = g.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                g.kill()
                text = g.communicate()[0]
            try:
                with open("/proc/%d/cmdline" % q) as f:
                    what = f.read().replace("\0", " ")[:200]
            except OSError:
                what = "?"
            parts.append("--- stacks of %d (%s)\n%s" % (q, what, "\n".join(
                l for l in text.splitlines() if l.startswith(("#", "Thread")))))
    return "\n".join(parts)


@pytest.fixture
def run_job():
    return kolo_run


# ---------------------------------------------------------------- Horovod-style modules
HOROVOD_STYLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_style")
HOROVOD_SUITE = os.path.join(HOROVOD_STYLE, "suite.py")


def run_horovod_style(modules, np_, timeout=240, env=None):
    """Runs a unittest module of tests/python/horovod_style (or a list of
    them, one after the other in the same processes) on every rank of an
    np_-rank job (suite.py) and checks that every rank passed."""
    args = [modules] if isinstance(modules, str) else list(modules)
    job = kolo_run(np_, HOROVOD_SUITE, args=args, timeout=timeout, env=env)
    summaries = [line for line in job.out.splitlines() if "SUITE rank" in line]
    assert job.rc == 0 and len(summaries) == np_, job
    for line in summaries:
        assert "failures 0, errors 0" in line, job
    return job
