"""kolo.tune: hyperparameter search on a kolo cluster (issue 18).

Each trial is a kolo job (`<study>/trial-N`) of np workers, placed by the
coordinator like any other, so trials share the cluster's slots and never
oversubscribe them. Optuna samples the parameters and decides pruning;
the intermediate values are the epoch reports every worker already sends
(`hvd.report_epoch(epoch, metrics={"loss": ...})`): the driver reads them
from the coordinator's REST API (`/api/v1/jobs/{id}/epochs`, the mean over
the ranks) and stops a pruned trial through the job stop path, so its
slots go to the next trial at once. The study lives in SQLite (Optuna's
RDB storage, `study.db` in the study's directory), so a search killed
half way continues with `resume=True`: finished trials stay, trials that
were running are run again.

    import kolo.tune
    best = kolo.tune.run(train_fn, {"lr": ("log", 1e-4, 1e-1), "batch": [32, 64]},
                         num_trials=12, np=2, max_concurrent=2, metric="accuracy",
                         mode="max")

The CLI, `kolo tune`, is `python3 -m kolo.tune` (see main()).
"""
import argparse
import base64
import difflib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from kolo._run import MAX_ENV_PAYLOAD, _kolo_binary, _pickle

POLL_S = 0.5
PR_SET_PDEATHSIG = 1
SPACE_KINDS = ("log", "uniform", "float", "int", "logint")
SAMPLERS = ("tpe", "random")
PRUNERS = ("asha", "median", "hyperband", "none")


class TuneError(ValueError):
    """A search that cannot start: a bad space, metric, mode or setting."""


class CoordinatorError(RuntimeError):
    """A call the coordinator refused, with the reason it gave (.code: the
    HTTP status, 0 for an RPC)."""

    def __init__(self, what, code, reason):
        super().__init__("kolo tune: the coordinator refused %s%s: %s"
                         % (what, " (HTTP %d)" % code if code else "", reason))
        self.code = code


# ---------------------------------------------------------------- the space

def _optuna():
    try:
        import optuna
    except ImportError:
        raise ImportError("kolo.tune needs Optuna (Debian: apt-get install python3-optuna)") \
            from None
    return optuna


def _number(a):
    """a as a number: an int or float (not a bool), or a string that reads
    as one - YAML 1.1 (PyYAML) reads `1e-3` as the string '1e-3', since
    its floats need a dot. None otherwise."""
    if isinstance(a, bool):
        return None
    if isinstance(a, (int, float)):
        return a
    if isinstance(a, str):
        try:
            v = float(a)
        except ValueError:
            return None
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return int(v) if v.is_integer() and "." not in a and "e" not in a.lower() else v
    return None


def _from_mapping(name, spec):
    """The mapping form other tools write, as the list form:
    {type: float|uniform|loguniform|int, low: L, high: H, log: bool} and
    {type: categorical|choice, choices: [...]}."""
    kind = str(spec.get("type", "")).lower()
    if kind in ("categorical", "choice"):
        choices = spec.get("choices", spec.get("values"))
        if not isinstance(choices, (list, tuple)) or not choices:
            raise TuneError("kolo.tune: %s: {type: %s} needs a non-empty list in choices"
                            % (name, kind))
        return ["choice"] + list(choices)
    if kind not in ("float", "uniform", "loguniform", "int", "integer"):
        raise TuneError("kolo.tune: %s: unknown type %r in %r; use float, int or categorical"
                        % (name, spec.get("type"), spec))
    if "low" not in spec or "high" not in spec:
        raise TuneError("kolo.tune: %s: {type: %s} needs low and high" % (name, kind))
    log = bool(spec.get("log", False)) or kind == "loguniform"
    if kind in ("int", "integer"):
        return ["logint" if log else "int", spec["low"], spec["high"]]
    return ["log" if log else "float", spec["low"], spec["high"]]


def parse_space(space):
    """{name: distribution} from Optuna distributions or a plain dict:
    ("log", lo, hi) and ("uniform"|"float", lo, hi) floats, ("int", lo, hi)
    and ("logint", lo, hi) integers, a list of choices (or ("choice", a,
    b, ...), the same), or the mapping form {type: float, low: L, high: H,
    log: true} / {type: int, ...} / {type: categorical, choices: [...]}.
    Bounds may be numbers written as strings ('1e-3', as YAML 1.1 reads
    it). Raises TuneError naming the parameter."""
    optuna = _optuna()
    dist = optuna.distributions
    if not isinstance(space, dict) or not space:
        raise TuneError("kolo.tune: the space must be a non-empty dict of parameter -> "
                        "distribution, not %r" % (space,))
    out = {}
    for name, spec in space.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TuneError("kolo.tune: parameter names must be identifiers, not %r" % (name,))
        if isinstance(spec, dist.BaseDistribution):
            out[name] = spec
            continue
        if isinstance(spec, dict):
            spec = _from_mapping(name, spec)
        if isinstance(spec, (list, tuple)) and spec and spec[0] in SPACE_KINDS:
            kind, args = spec[0], [_number(a) for a in spec[1:]]
            if len(args) != 2 or any(a is None for a in args):
                raise TuneError("kolo.tune: %s: (%r, low, high) needs two numbers, got %r"
                                % (name, kind, list(spec[1:])))
            lo, hi = args
            if not lo < hi:
                raise TuneError("kolo.tune: %s: low %r must be below high %r" % (name, lo, hi))
            if kind in ("log", "logint") and lo <= 0:
                raise TuneError("kolo.tune: %s: a log range needs low > 0, got %r" % (name, lo))
            if kind in ("int", "logint"):
                if int(lo) != lo or int(hi) != hi:
                    raise TuneError("kolo.tune: %s: an int range needs whole bounds" % name)
                out[name] = dist.IntDistribution(int(lo), int(hi), log=kind == "logint")
            else:
                out[name] = dist.FloatDistribution(float(lo), float(hi), log=kind == "log")
            continue
        if isinstance(spec, (list, tuple)) and spec and spec[0] == "choice":
            spec = spec[1:]  # ("choice", a, b, ...), as --help and docs/tune.md write it
            if not spec:
                raise TuneError("kolo.tune: %s: (\"choice\", ...) needs at least one choice"
                                % name)
        if isinstance(spec, (list, tuple)) and spec:
            if any(not isinstance(c, (str, int, float, bool)) and c is not None for c in spec):
                raise TuneError("kolo.tune: %s: choices must be strings, numbers, booleans or "
                                "None, got %r" % (name, spec))
            out[name] = dist.CategoricalDistribution(list(spec))
            continue
        raise TuneError("kolo.tune: %s: unknown distribution %r; use (%s, low, high), a list "
                        "of choices or an Optuna distribution"
                        % (name, spec, "|".join(SPACE_KINDS)))
    return out


def load_space_file(path):
    """The space from a YAML (or JSON) file: `lr: [log, 1e-4, 1e-1]`,
    `batch: [32, 64]`."""
    with open(path) as f:
        text = f.read()
    try:
        import yaml
        data = yaml.safe_load(text)
    except ImportError:
        data = json.loads(text)
    return parse_space(data)


def _sampler(name, seed):
    optuna = _optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise TuneError("kolo.tune: sampler must be one of %s, not %r" % (", ".join(SAMPLERS), name))


def _pruner(name):
    optuna = _optuna()
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if name == "none":
        return optuna.pruners.NopPruner()
    raise TuneError("kolo.tune: pruner must be one of %s, not %r" % (", ".join(PRUNERS), name))


# ---------------------------------------------------------------- the cluster

def _private_dir(path):
    """Makes path (and its parents) and leaves path itself 0700, whatever
    the umask: the study's files are the user's alone (issue 28)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _private_file(path, mode="w"):
    """Opens path for writing, created or truncated 0600 whatever the
    umask (an existing file is made 0600 too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


def _die_with_driver():
    """preexec_fn: the child gets SIGTERM when the driver dies, even by
    SIGKILL, so no coordinator, agent or trial outlives a killed search
    (which --resume then continues)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _Cluster:
    """The coordinator trials run on: a local one (a coordinator and one
    agent of `slots` slots, in the study's directory) unless coordinator
    (an RPC URL) and http (its REST base URL) name a running one."""

    def __init__(self, kolo, state_dir, slots, coordinator=None, http=None, token_file=None):
        self.kolo = kolo
        self.procs = []
        self.token = None
        if token_file:
            with open(token_file) as f:
                self.token = f.read().strip()
        self.token_file = token_file
        if coordinator:
            if not http:
                raise TuneError("kolo.tune: with coordinator=, give http= too: the REST URL "
                                "of that coordinator (epoch reports and stops go through it)")
            self.rpc, self.http = coordinator, http.rstrip("/")
            return
        _private_dir(state_dir)
        # A cluster token: REST stops pruned trials, and REST changes state
        # only with one. 0600, the study's own.
        self.token_file = os.path.join(state_dir, "token")
        self.token = secrets.token_hex(32)
        with _private_file(self.token_file) as f:
            f.write(self.token + "\n")
        coord = subprocess.Popen([kolo, "coordinator", "--listen", "tcp://127.0.0.1:0",
                                  "--http", "127.0.0.1:0", "--db",
                                  os.path.join(state_dir, "coordinator.db"),
                                  "--token-file", self.token_file, "--log-level", "warn"],
                                 stdout=subprocess.PIPE, text=True, start_new_session=True,
                                 preexec_fn=_die_with_driver)
        self.procs.append(coord)
        ready = coord.stdout.readline()
        if "rpc=" not in ready:
            self.close()
            raise RuntimeError("kolo.tune: the local coordinator did not start: %r" % ready)
        self.rpc = ready.split("rpc=")[1].split()[0]
        self.http = ready.split("http=")[1].split()[0]
        # whatever else it prints must not fill the pipe and stall it
        threading.Thread(target=coord.stdout.read, daemon=True).start()
        self.procs.append(subprocess.Popen(
            [kolo, "agent", "--coordinator", self.rpc, "--slots", str(slots), "--name", "tune",
             "--state-dir", os.path.join(state_dir, "agent"), "--token-file", self.token_file,
             "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_driver))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if any(h.get("state") == "alive" for h in self.get("/api/v1/hosts")["hosts"]):
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("kolo.tune: the local agent did not register within 30 s")


    def view_query(self):
        """"?key=..." for a dashboard link: the view key (common/creds.h,
        HMAC(token, "kolo-dashboard-view")) opens the trials' output and
        command lines to the browser that follows the link; "" without a
        token."""
        if not self.token:
            return ""
        import hashlib
        import hmac
        mac = hmac.new(self.token.encode(), b"kolo-dashboard-view\0", hashlib.sha256)
        return "?key=" + mac.hexdigest()[:32]
    def request(self, method, path, body=None):
        req = urllib.request.Request(self.http + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            # the coordinator says why in the body ({"error": ...}): keep it
            try:
                body = e.read().decode(errors="replace")
                reason = json.loads(body).get("error") or body
            except (OSError, ValueError, AttributeError):
                reason = e.reason
            raise CoordinatorError("%s %s" % (method, path), e.code, reason) from None

    def get(self, path):
        return self.request("GET", path)

    def free_slots(self):
        """Slots no job uses on the live hosts (REST /hosts)."""
        return sum(max(0, h["slots"] - h["slots_used"]) for h in self.get("/api/v1/hosts")["hosts"]
                   if h.get("state") == "alive")

    def job_id(self, name):
        """The newest job of this name, or None."""
        ids = [j["id"] for j in self.get("/api/v1/jobs")["jobs"] if j.get("name") == name]
        return max(ids) if ids else None

    def stop(self, job, reason):
        """True if the job is stopped, False if it had already ended. With a
        token over REST; without one (a coordinator started by hand without
        --token-file serves its admin calls to its own user only, over RPC,
        and refuses REST writes) with `kolo stop`."""
        if not self.token:
            if self.get("/api/v1/jobs/%d" % job).get("state") not in ("pending", "running"):
                return False  # ended already (reads need no token)
            cmd = [self.kolo, "stop", "--coordinator", self.rpc, "--reason", reason, str(job)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                raise CoordinatorError("stopping job %d" % job, 0,
                                       (p.stderr or p.stdout).strip())
            return p.stdout.strip().endswith(": stopped")
        try:
            self.request("POST", "/api/v1/jobs/%d/stop" % job, {"reason": reason})
        except CoordinatorError as e:
            if e.code != 409:  # already ended
                raise
            return False
        return True

    def launch(self, name, np_, min_np, max_np, argv, env, log, metadata):
        cmd = [self.kolo, "run", "--coordinator", self.rpc, "--name", name, "-np", str(np_),
               "--metadata", json.dumps(metadata)]
        if min_np is not None:
            cmd += ["--min-np", str(min_np)]
        if max_np is not None:
            cmd += ["--max-np", str(max_np)]
        if self.token_file:
            cmd += ["--token-file", self.token_file]
        return subprocess.Popen(cmd + ["--"] + argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_driver)

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []


# ---------------------------------------------------------------- trials

class _Trial:
    def __init__(self, trial, proc, name, log_path, search_t0):
        self.trial = trial
        self.proc = proc
        self.name = name
        self.log_path = log_path
        self.job = None
        self.started = time.monotonic()
        self.search_t0 = search_t0
        self.epochs = {}  # epoch -> value of the metric
        self.pruned = False


def _command(trainable, params, tmp, python):
    """The argv of a trial and the extra environment it needs."""
    if callable(trainable):
        cloudpickle = _pickle()
        payload = cloudpickle.dumps((trainable, (dict(params),), {}))
        encoded = base64.b64encode(payload).decode()
        if len(encoded) > MAX_ENV_PAYLOAD:
            raise TuneError("kolo.tune: the trainable pickles to %d bytes, too many to ship; "
                            "use a script" % len(payload))
        return [python, "-m", "kolo._run_worker", tmp], {"KOLO_RUN_PAYLOAD": encoded}
    argv = trainable.split() if isinstance(trainable, str) else list(trainable)
    try:
        return [a.format(**params) for a in argv], {}
    except (KeyError, IndexError) as e:
        raise TuneError("kolo.tune: the command names {%s}, which is not in the space"
                        % str(e).strip("'")) from None


def _metric_of(epoch_row, metric):
    for key in ("metrics_mean", "metrics"):
        m = epoch_row.get(key)
        if isinstance(m, dict) and isinstance(m.get(metric), (int, float)):
            return float(m[metric])
    return None


def run(trainable, space, num_trials, np=2, min_np=None, max_np=None, max_concurrent=None,
        metric="loss", mode="min", sampler="tpe", pruner="asha", coordinator=None,
        study_name=None, http=None, token_file=None, slots=None, directory=None, seed=None,
        resume=False, verbose=True, env=None):
    """Searches `space` with num_trials trials of `trainable` (a function
    called with the parameters as a dict on every worker, or a command
    whose arguments may hold {param} placeholders), each a kolo job of np
    workers (elastic with min_np/max_np), at most max_concurrent at once
    (default: as many as the slots hold). metric: the key of the trials'
    `report_epoch(metrics=...)` to optimise in `mode` ("min" or "max");
    sampler "tpe"|"random"; pruner "asha"|"median"|"hyperband"|"none".
    A local cluster of `slots` slots (default np x max_concurrent, else
    2 x np) is started in `directory` unless coordinator (RPC URL) and
    http (REST URL) name one. The study is `directory`/study.db; resume
    continues it. Returns {"best_params", "best_value", "best_trial",
    "study", "directory", "trials": [one dict per trial]}."""
    optuna = _optuna()
    dists = parse_space(space)
    if not isinstance(metric, str) or not metric:
        raise TuneError("kolo.tune: metric must be the name of a reported metric, not %r"
                        % (metric,))
    if mode not in ("min", "max"):
        raise TuneError("kolo.tune: mode must be 'min' or 'max', not %r" % (mode,))
    if int(num_trials) < 1 or int(np) < 1:
        raise TuneError("kolo.tune: num_trials and np must be at least 1")
    if not callable(trainable):
        _command(trainable, {k: 0 for k in dists}, "", "")  # placeholders name the space
    study_name = study_name or "study-%s" % time.strftime("%Y%m%d-%H%M%S")
    if "/" in study_name or not study_name.strip() or len(study_name.encode()) > 128:
        raise TuneError("kolo.tune: the study name %r must be 1 to 128 bytes without '/'"
                        % study_name)
    directory = os.path.abspath(directory or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "kolo",
        "tune", study_name))
    if resume and not os.path.exists(os.path.join(directory, "study.db")):
        raise TuneError("kolo.tune: no study %s to resume (%s/study.db)" % (study_name,
                                                                            directory))
    if max_concurrent is None:
        max_concurrent = max(1, (slots or 2 * int(np)) // int(np))
    slots = slots or int(np) * int(max_concurrent)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The study's directory and everything in it are the user's alone (0700
    # directories, 0600 files, whatever the umask): trial logs hold the
    # trials' output, the database their parameters and results. SQLite
    # gives its journal the database file's mode, so the database is made
    # 0600 before Optuna opens it.
    _private_dir(directory)
    db = os.path.join(directory, "study.db")
    os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(db, 0o600)
    study = optuna.create_study(study_name=study_name,
                                storage="sqlite:///" + db,
                                direction="minimize" if mode == "min" else "maximize",
                                sampler=_sampler(sampler, seed), pruner=_pruner(pruner),
                                load_if_exists=resume)
    study.set_user_attr("kolo", {"metric": metric, "mode": mode, "np": int(np)})
    TS = optuna.trial.TrialState
    # a driver that died left RUNNING trials: they run again
    for t in study.get_trials(deepcopy=False, states=(TS.RUNNING,)):
        study.tell(t.number, state=TS.FAIL)
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
        _say(verbose, "trial %d was running when the search stopped: queued again" % t.number)
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, base_env.get("PYTHONPATH"))
                                             if p)
    base_env.update({k: str(v) for k, v in (env or {}).items()})
    logs = os.path.join(directory, "logs")
    _private_dir(logs)
    tmp = tempfile.mkdtemp(prefix="run-", dir=directory)  # a killed driver leaves it there
    cluster = _Cluster(_kolo_binary(), os.path.join(directory, "cluster"), slots, coordinator,
                       http, token_file)
    _say(verbose, "study %s on the dashboard: %s/%s#/studies/%s"
         % (study_name, cluster.http, cluster.view_query(),
            urllib.parse.quote(study_name, safe="")))
    running = []
    t0 = time.monotonic()
    try:
        while True:
            finished = _finished(study, TS)
            while len(running) < max_concurrent and finished + len(running) < num_trials:
                size = np
                if min_np is not None:
                    # an elastic trial starts on what is free now (at least
                    # min_np, at most max_np) and grows as slots free up
                    if running and not _submitted(cluster, running[-1]):
                        break  # its slots are not counted yet: next poll
                    try:
                        free = cluster.free_slots()
                    except (OSError, ValueError, KeyError):
                        break
                    size = max(int(min_np), min(int(max_np or np), free))
                trial = study.ask(dists)
                name = "%s/trial-%d" % (study_name, trial.number)
                argv, extra = _command(trainable, trial.params, tmp, python)
                log_path = os.path.join(logs, "trial-%d.log" % trial.number)
                log = _private_file(log_path)
                trial.set_user_attr("job_name", name)
                trial.set_user_attr("log", log_path)
                labels = {"kolo.study": study_name, "kolo.trial": str(trial.number),
                          "kolo.params": json.dumps(trial.params), "kolo.metric": metric,
                          "kolo.mode": mode}
                proc = cluster.launch(name, size, min_np, max_np, argv, dict(base_env, **extra),
                                      log, labels)
                log.close()
                running.append(_Trial(trial, proc, name, log_path, t0))
                _say(verbose, "trial %d started: %s" % (trial.number, _fmt(trial.params)))
            if not running:
                break
            time.sleep(POLL_S)
            for rt in list(running):
                _poll_trial(cluster, study, rt, metric, TS)
                if rt.proc.poll() is not None:
                    running.remove(rt)
                    _finish_trial(cluster, study, rt, metric, TS, verbose, mode)
    except BaseException:
        for rt in running:
            if rt.job is not None:
                try:
                    cluster.stop(rt.job, "the search was interrupted")
                except OSError:
                    pass
            rt.proc.terminate()
        raise
    finally:
        for rt in running:
            try:
                rt.proc.wait(30)
            except subprocess.TimeoutExpired:
                rt.proc.kill()
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return _summary(study, directory, time.monotonic() - t0, TS)


def _find_job(cluster, rt):
    """The trial's job id once it is on the coordinator (placed or queued),
    else None; kept on the trial and in its study record."""
    if rt.job is None:
        rt.job = cluster.job_id(rt.name)
        if rt.job is not None:
            rt.trial.set_user_attr("job", rt.job)
    return rt.job


def _submitted(cluster, rt):
    """True once the trial's job is on the coordinator, or its kolo run ended."""
    try:
        return _find_job(cluster, rt) is not None or rt.proc.poll() is not None
    except (OSError, ValueError):
        return False


def _finished(study, TS):
    """Trials that count toward num_trials: complete, pruned and failed
    ones, less those queued again (each stale trial's run again once)."""
    trials = study.get_trials(deepcopy=False)
    ended = sum(t.state in (TS.COMPLETE, TS.PRUNED, TS.FAIL) for t in trials)
    return ended - sum("requeued_from" in t.user_attrs for t in trials)


def _poll_trial(cluster, study, rt, metric, TS):
    """Reads the trial's new epochs, reports them, prunes if Optuna says so."""
    try:
        if _find_job(cluster, rt) is None:
            return
        rows = cluster.get("/api/v1/jobs/%d/epochs" % rt.job).get("epochs", [])
    except (OSError, ValueError):
        return  # the coordinator is busy or restarting: next time
    for row in rows:
        e = row.get("epoch")
        if not row.get("complete") or e in rt.epochs:
            continue
        value = _metric_of(row, metric)
        if value is None:
            seen = sorted(set((row.get("metrics_mean") or {}).keys()) |
                          set((row.get("metrics") or {}).keys()))
            raise TuneError("kolo.tune: trial %d reported epoch %d without the metric %r "
                            "(it reported: %s); report it with hvd.report_epoch(epoch, "
                            "metrics={%r: value})" % (rt.trial.number, e, metric,
                                                      ", ".join(seen) or "no metrics", metric))
        rt.epochs[e] = value
        rt.trial.report(value, e)
    if not rt.pruned and rt.epochs and rt.trial.should_prune():
        # The reason starts with "pruned": the coordinator's study view
        # reads it so. A job that ended before the stop (the pruner spoke
        # at its last epoch) completed, for the coordinator and for Optuna.
        rt.pruned = cluster.stop(rt.job, "pruned by kolo tune after epoch %d" % max(rt.epochs))


def _finish_trial(cluster, study, rt, metric, TS, verbose, mode):
    _poll_trial(cluster, study, rt, metric, TS)  # epochs reported at the very end
    rc = rt.proc.returncode
    took = time.monotonic() - rt.started
    rt.trial.set_user_attr("seconds", round(took, 3))
    rt.trial.set_user_attr("ended_s", round(time.monotonic() - rt.search_t0, 3))
    rt.trial.set_user_attr("epochs", len(rt.epochs))
    last = rt.epochs[max(rt.epochs)] if rt.epochs else None
    if rt.pruned:
        study.tell(rt.trial, state=TS.PRUNED)
        what = "pruned after %d epoch(s) at %s=%.4g" % (len(rt.epochs), metric, last)
    elif rc == 0 and last is not None:
        study.tell(rt.trial, last)
        what = "finished: %s=%.4g after %d epoch(s)" % (metric, last, len(rt.epochs))
    else:
        why = ("exit code %d" % rc) if rc else "no epoch reported %r" % metric
        rt.trial.set_user_attr("error", "%s (log: %s)" % (why, rt.log_path))
        study.tell(rt.trial, state=TS.FAIL)
        what = "failed: %s; see %s" % (why, rt.log_path)
    try:
        best = "best so far: trial %d, %s=%.4g" % (study.best_trial.number, metric,
                                                 study.best_value)
    except ValueError:
        best = "no trial finished yet"
    _say(verbose, "trial %d %s (%.1f s); %s" % (rt.trial.number, what, took, best))


def _summary(study, directory, seconds, TS):
    trials = []
    for t in study.get_trials(deepcopy=False):
        trials.append({"number": t.number, "state": t.state.name.lower(), "params": t.params,
                       "value": t.value, "epochs": t.user_attrs.get("epochs", 0),
                       "seconds": t.user_attrs.get("seconds"),
                       "ended_s": t.user_attrs.get("ended_s"), "job": t.user_attrs.get("job"),
                       "job_name": t.user_attrs.get("job_name"),
                       "error": t.user_attrs.get("error")})
    out = {"study": study.study_name, "directory": directory, "trials": trials,
           "seconds": round(seconds, 3), "best_params": None, "best_value": None,
           "best_trial": None}
    try:
        out.update(best_params=study.best_params, best_value=study.best_value,
                   best_trial=study.best_trial.number)
    except ValueError:
        pass
    return out


def _fmt(params):
    return ", ".join("%s=%s" % (k, ("%.4g" % v) if isinstance(v, float) else v)
                     for k, v in params.items())


def _say(verbose, text):
    if verbose:
        print("[kolo tune] " + text, flush=True)


# ---------------------------------------------------------------- CLI

class _Parser(argparse.ArgumentParser):
    """argparse with --help in the layout of every other kolo command
    (common/knobs.c): the usage, a sentence, then one entry a flag, its
    spellings and value in a 28-column field and its description, with its
    default in parentheses, wrapped to 80 columns."""

    def format_help(self):
        width, columns = 30, 80
        out = ["usage: " + self.usage, "", self.description, "",
               "Options:"]
        for act in self._actions:
            if not act.option_strings:
                continue
            flags = ", ".join(act.option_strings)
            if act.nargs != 0:
                flags += " <%s>" % act.metavar
            text = act.help or ""
            if act.default not in (None, argparse.SUPPRESS):
                text += " (default %s)" % act.default
            lines = textwrap.wrap(text, columns - width, break_on_hyphens=False) or [""]
            if len(flags) < width - 1:
                out.append("  %-*s%s" % (width - 2, flags, lines[0]))
            else:
                out.append("  " + flags)
                out.append(" " * width + lines[0])
            out += [" " * width + l for l in lines[1:]]
        return "\n".join(out) + "\n"

    def error(self, message):
        """As argparse's, naming the nearest flag of an unknown one, as
        the other kolo commands do (-n: did you mean -np?)."""
        if message.startswith("unrecognized arguments: "):
            known = [o for act in self._actions for o in act.option_strings]
            for word in message.split(": ", 1)[1].split():
                near = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
                if word.startswith("-") and near:
                    message = "unknown flag %s (did you mean %s?)" % (word, near[0])
                    break
        self.print_usage(sys.stderr)
        self.exit(2, "%s: %s\n" % (self.prog, message))


def main(argv=None):
    """kolo tune --trials 20 --np 2 --max-concurrent 2 --space space.yaml
    --metric loss --mode min -- python3 train.py --lr {lr}"""
    ap = _Parser(
        prog="kolo tune",
        usage="kolo tune --space FILE [--trials N] [-np N] [--metric NAME --mode min|max]\n"
              "                 [--coordinator URL --http URL] [options] -- command {name}...",
        description="Hyperparameter search: each trial is a kolo job, Optuna samples the space\n"
                    "and prunes from the trials' epoch reports. Every {name} in the command is\n"
                    "replaced by the trial's value (docs/tune.md).",
        add_help=False, allow_abbrev=False)
    ap.add_argument("-h", "--help", action="help", help="print this help and exit")
    ap.add_argument("--trials", type=int, default=10, metavar="int",
                    help="trials in all (a resumed study counts the ones it has)")
    ap.add_argument("-np", "--np", type=int, default=2, dest="np", metavar="int",
                    help="workers per trial")
    ap.add_argument("--min-np", type=int, metavar="int",
                    help="elastic trials: the fewest workers a trial goes on with")
    ap.add_argument("--max-np", type=int, metavar="int",
                    help="elastic trials: the most workers a trial grows to")
    ap.add_argument("--max-concurrent", type=int, metavar="int",
                    help="trials at once; unset: what the slots hold")
    ap.add_argument("--slots", type=int, metavar="int",
                    help="slots of the local cluster; unset: np x max-concurrent")
    ap.add_argument("--space", metavar="str", help="YAML file of the space, required: "
                    "name: [log, 1e-4, 1e-1] | [uniform, lo, hi] | [int, 16, 128] | "
                    "[logint, lo, hi] | [choice, ...] | {type: float, low: ..., high: ..., "
                    "log: true}")
    ap.add_argument("--metric", default="loss", metavar="str",
                    help="the hvd.report_epoch metric to optimise")
    ap.add_argument("--mode", default="min", choices=("min", "max"), metavar="min|max",
                    help="minimise or maximise the metric")
    ap.add_argument("--sampler", default="tpe", choices=SAMPLERS, metavar="|".join(SAMPLERS),
                    help="Optuna's sampler")
    ap.add_argument("--pruner", default="asha", choices=PRUNERS, metavar="|".join(PRUNERS),
                    help="Optuna's pruner (successive halving, median, Hyperband, none)")
    ap.add_argument("--seed", type=int, metavar="int", help="the sampler's seed: a repeatable search")
    ap.add_argument("--study", dest="study_name", metavar="str",
                    help="study name, the trials are jobs NAME/trial-N; unset: study-<time>")
    ap.add_argument("--resume", metavar="str", help="continue this study")
    ap.add_argument("--dir", dest="directory", metavar="str",
                    help="the study's directory; unset: ~/.local/state/kolo/tune/NAME")
    ap.add_argument("--coordinator", metavar="str",
                    help="run the trials on this coordinator (RPC URL) instead of a local cluster")
    ap.add_argument("--http", metavar="str", help="with --coordinator: its REST URL")
    ap.add_argument("--token-file", metavar="str", help="with --coordinator: the cluster token")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the trial's command")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the trial's command after --")
    if not a.space:
        ap.error("--space FILE is required")
    try:
        space = load_space_file(a.space)
        result = run(cmd, space, a.trials, np=a.np, min_np=a.min_np, max_np=a.max_np,
                     max_concurrent=a.max_concurrent, metric=a.metric, mode=a.mode,
                     sampler=a.sampler, pruner=a.pruner, coordinator=a.coordinator,
                     http=a.http, token_file=a.token_file, slots=a.slots,
                     study_name=a.resume or a.study_name, directory=a.directory, seed=a.seed,
                     resume=bool(a.resume))
    except (TuneError, OSError) as e:
        print("kolo tune: %s" % e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kolo tune: interrupted; continue with --resume", file=sys.stderr)
        return 130
    print("[kolo tune] study %s: %d trials in %.1f s, best trial %s: %s = %s (%s)" % (
        result["study"], len(result["trials"]), result["seconds"], result["best_trial"],
        a.metric, result["best_value"], _fmt(result["best_params"] or {})))
    return 0 if result["best_trial"] is not None else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
