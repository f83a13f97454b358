"""kolo.run(fn): run a Python function on np workers and get its results.

What `horovod.run(fn, np=4)` and HorovodRunner's `hr.run(train_fn)` do,
for notebooks and scripts: the function and its arguments are pickled
with cloudpickle (so lambdas, closures and functions defined in a
notebook cell travel), every worker runs it under `kolo run`, and the
caller gets the return values in rank order. The function calls
`kolo.init()` / `hvd.init()` itself, as with Horovod.

How it travels. The caller writes the pickle to a private (0700)
directory and starts `kolo run -np N -- python3 -m kolo._run_worker DIR`
(an embedded coordinator unless `coordinator=` names a cluster). On
other hosts the directory is not there, so the pickle also rides in the
job's environment (`KOLO_RUN_PAYLOAD`, base64) when it is small enough
(MAX_ENV_PAYLOAD); a larger one needs a directory every host sees
(`workdir=`). Each worker prints its result as one marked line on its
stdout, which kolo run streams back through the coordinator from any
host: the caller takes those lines out and prints everything else (a
notebook cell shows the workers' output as they run). Each marked line
carries a MAC keyed with a secret of the call (KOLO_RUN_KEY in the job's
environment, which the worker removes before the function runs): a line
that does not verify is printed as output, never unpickled.

Failure. A worker whose function raises prints the exception (pickled
when it can be) with its traceback; the caller raises it again, with the
rank and the worker's traceback in its message: the lowest rank's that
raised an error of its own, not a HorovodInternalError another rank's
collective got because that rank left. A job that fails
otherwise (a worker killed, no slots) raises RuntimeError with kolo run's
reason.
"""
import base64
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
import tempfile
import threading

RESULT_MARK = "@@kolo.run.result@@ "
ERROR_MARK = "@@kolo.run.error@@ "
MAX_ENV_PAYLOAD = 96 << 10  # Linux caps one variable at 128 KiB
KEY_ENV = "KOLO_RUN_KEY"


def seal_line(key, mark, blob):
    """One marked output line: the mark, a MAC over mark and data keyed with
    the call's secret, and the data (base64)."""
    data = base64.b64encode(blob).decode()
    mac = hmac.new(bytes.fromhex(key), (mark + data).encode(), hashlib.sha256).hexdigest()
    return "%s%s %s" % (mark, mac, data)


def open_line(key, mark, rest):
    """The data of a marked line's rest (after the mark), or None when its
    MAC does not verify: output that merely looks like a result is never
    unpickled."""
    mac, sep, data = rest.strip().partition(" ")
    if not sep:
        return None
    want = hmac.new(bytes.fromhex(key), (mark + data).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, want):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        return None


def _pickle():
    try:
        import cloudpickle
    except ImportError:
        raise ImportError("kolo.run needs cloudpickle to ship the function (Debian: apt-get "
                          "install python3-cloudpickle)") from None
    return cloudpickle


def _kolo_binary():
    """$KOLO_BIN, then kolo next to this package's build tree, then PATH."""
    env = os.environ.get("KOLO_BIN")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    build = os.environ.get("KOLO_BUILD_DIR") or os.path.join(repo, "build")
    local = os.path.join(build, "bin", "kolo")
    if os.access(local, os.X_OK):
        return local
    found = shutil.which("kolo")
    if found:
        return found
    raise FileNotFoundError("kolo.run cannot find the kolo program: put it on PATH or set "
                            "KOLO_BIN")


class WorkerError(RuntimeError):
    """A worker's exception that could not be pickled back: its type name,
    text and traceback, as the worker printed them."""


def run(fn, args=(), kwargs=None, np=2, min_np=None, max_np=None, hosts=None, hostfile=None,
        coordinator=None, token_file=None, start_timeout=None, env=None, workdir=None,
        executable=None, output_filename=None, verbose=None, stream=True, run_args=(),
        **ignored):
    """Runs fn(*args, **kwargs) on np workers; returns the list of their
    return values, rank 0 first.

    np, min_np, max_np, hosts ("h1:2,h2:2"), hostfile, start_timeout
    (seconds), output_filename and verbose are horovodrun's (and
    horovod.run's); coordinator (an RPC URL) and token_file submit to a
    running cluster instead of an embedded one. env: extra variables for
    the workers. workdir: a directory every host sees, for functions
    whose pickle is too large for the environment. executable: the
    workers' Python (default /usr/bin/python3 when it exists, else this
    interpreter). stream: print the workers' output as it comes
    (otherwise it is dropped). run_args: more `kolo run` flags
    (["--encrypt-data"], ["--state-dir", DIR], ...). horovod.run's SSH, MPI and Gloo arguments
    (ssh_port, use_gloo, use_mpi, mpi_args, network_interface, ...) are
    accepted and ignored: kolo has no use for them.
    """
    if not callable(fn):
        raise TypeError("kolo.run: fn must be callable, got %r" % (fn,))
    if int(np) < 1:
        raise ValueError("kolo.run: np must be at least 1, got %r" % (np,))
    cloudpickle = _pickle()
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    python = executable or ("/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK)
                            else sys.executable)
    tmp = tempfile.mkdtemp(prefix="kolo-run-", dir=workdir)  # 0700
    try:
        with open(os.path.join(tmp, "payload.pkl"), "wb") as f:
            f.write(payload)
        cmd = [_kolo_binary(), "run", "-np", str(int(np))]
        for flag, value in (("--min-np", min_np), ("--max-np", max_np), ("-H", hosts),
                            ("--hostfile", hostfile), ("--coordinator", coordinator),
                            ("--token-file", token_file), ("--start-timeout", start_timeout),
                            ("--output-filename", output_filename)):
            if value is not None:
                cmd += [flag, str(value)]
        if verbose:
            cmd.append("--verbose")
        cmd += [str(a) for a in run_args]
        cmd += ["--", python, "-m", "kolo._run_worker", tmp]
        child_env = dict(os.environ)
        # the workers import this same kolo package
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pkg_root, child_env.get("PYTHONPATH")) if p)
        encoded = base64.b64encode(payload).decode()
        if len(encoded) <= MAX_ENV_PAYLOAD:
            child_env["KOLO_RUN_PAYLOAD"] = encoded
        elif (coordinator or hosts or hostfile) and workdir is None:
            raise ValueError("kolo.run: the function and its arguments pickle to %d bytes, too "
                             "many for the job's environment; pass workdir= a directory every "
                             "host sees" % len(payload))
        child_env.update({k: str(v) for k, v in (env or {}).items()})
        # The call's secret: only lines MAC'd with it are unpickled.
        key = os.urandom(32).hex()
        child_env[KEY_ENV] = key
        elastic = min_np is not None or max_np is not None
        return _launch(cmd, child_env, None if elastic else int(np), stream, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# What a rank raises because another rank failed (its collective ended
# when that rank left): never the cause the caller wants to see.
_CONSEQUENCES = ("HorovodInternalError", "HostsUpdatedInterrupt")


def _first_cause(errors, cloudpickle):
    """(rank, exception, traceback) to raise: the lowest rank that raised
    an error of its own (rank 1's ValueError, not the HorovodInternalError
    rank 0's allreduce got when rank 1 left), else the lowest."""
    first = None
    for rank in sorted(errors):
        exc, tb = cloudpickle.loads(errors[rank])
        if first is None:
            first = (rank, exc, tb)
        if type(exc).__name__ not in _CONSEQUENCES:
            return rank, exc, tb
    return first


def _launch(cmd, env, np, stream, key):
    """Runs kolo run; np None (elastic): whatever ranks finished. Only
    result and error lines whose MAC verifies under key are taken (and
    unpickled); any other line is the job's output."""
    results, errors = {}, {}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", bufsize=1)
    err_tail = []

    def pump_stderr():
        for line in proc.stderr:
            err_tail.append(line)
            del err_tail[:-20]
            if stream:
                sys.stderr.write(line)
                sys.stderr.flush()

    t = threading.Thread(target=pump_stderr, daemon=True)
    t.start()
    for line in proc.stdout:
        # kolo run prints "[rank]<stdout>:text"
        head, sep, text = line.partition("]<stdout>:")
        if sep and head.startswith("[") and head[1:].isdigit():
            rank = int(head[1:])
            for mark, into in ((RESULT_MARK, results), (ERROR_MARK, errors)):
                blob = open_line(key, mark, text[len(mark):]) if text.startswith(mark) else None
                if blob is not None:
                    into[rank] = blob
                    break
            else:
                blob = None
            if blob is not None:
                continue
        if stream:
            sys.stdout.write(line)
            sys.stdout.flush()
    rc = proc.wait()
    t.join(timeout=5)
    cloudpickle = _pickle()
    if errors:
        rank, exc, tb = _first_cause(errors, cloudpickle)
        if isinstance(exc, BaseException):
            if hasattr(exc, "add_note"):
                exc.add_note("kolo.run: raised on rank %d; its traceback:\n%s" % (rank, tb))
            raise exc from WorkerError("rank %d raised, worker traceback:\n%s" % (rank, tb))
        raise WorkerError("rank %d raised %s\n%s" % (rank, exc, tb))
    if rc != 0 or not results or (np is not None and len(results) != np):
        why = "".join(line for line in err_tail if line.startswith("[kolo]")).strip()
        raise RuntimeError("kolo.run: the job failed (exit code %d)%s" %
                           (rc, ": " + why if why else ""))
    return [cloudpickle.loads(results[r]) for r in sorted(results)]
