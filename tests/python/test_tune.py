"""kolo.tune (issue 18): a real search on a local coordinator and agent.

Trials are kolo jobs running examples/pytorch/digits.py (or a small script
here); the tests check what the issue names: the search finishes and
finds >= 0.97 accuracy, pruning stops trials early, the slots are never
oversubscribed (from the coordinator's own records of when each job ran),
a crashing trial is recorded as failed and the search goes on, a killed
driver's study resumes with no trial lost, bad spaces, metrics and
modes are refused before any job starts, elastic trials start on the
slots that are free and shrink when a host leaves, and the coordinator's
own view of the study (REST /studies) agrees with the search.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kolo.tune  # noqa: E402

optuna = pytest.importorskip("optuna")
if os.environ.get("KOLO"):
    os.environ.setdefault("KOLO_BIN", os.environ["KOLO"])
DIGITS = os.path.join(ROOT, "examples", "pytorch", "digits.py")

# A trial that reports loss = (x - 0.3)^2 + 1/(epoch+1) for 4 epochs of
# EPOCH_S seconds and crashes in its second epoch when x is above argv[3].
QUADRATIC = r'''
import sys, time
sys.path.insert(0, sys.argv[2])
import kolo
x = float(sys.argv[1])
crash_above = float(sys.argv[3]) if len(sys.argv) > 3 else 9.0
kolo.init()
for epoch in range(4):
    time.sleep(EPOCH_S)
    if x > crash_above and epoch == 1:
        raise SystemExit("trial crashed on purpose at x=%g" % x)
    kolo.report_epoch(epoch, metrics={"loss": (x - 0.3) ** 2 + 1.0 / (epoch + 1)})
kolo.shutdown()
'''


def max_slots_in_use(directory):
    """The most ranks that ran at once, from the local coordinator's job
    records (start and end of every trial job)."""
    db = sqlite3.connect(os.path.join(directory, "cluster", "coordinator.db"))
    rows = db.execute("SELECT np, started_ms, ended_ms FROM jobs WHERE started_ms > 0").fetchall()
    db.close()
    edges = []
    for np_, start, end in rows:
        edges.append((start, np_))
        edges.append((end or 2 ** 62, -np_))
    used = most = 0
    for _, d in sorted(edges, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        used += d
        most = max(most, used)
    return most


def coordinator_view(directory, study):
    """GET /api/v1/studies and /api/v1/studies/STUDY from a coordinator
    started again on the search's database (the local one ended with the
    search): the study is durable and derived from the jobs alone."""
    p = subprocess.Popen([os.environ["KOLO_BIN"], "coordinator", "--listen", "tcp://127.0.0.1:0",
                          "--http", "127.0.0.1:0", "--db",
                          os.path.join(directory, "cluster", "coordinator.db")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        assert "http=" in line, line
        base = line.split("http=")[1].split()[0]
        get = lambda path: json.loads(urllib.request.urlopen(base + path, timeout=10).read())
        return get("/api/v1/studies"), get("/api/v1/studies/" + urllib.parse.quote(study))
    finally:
        p.terminate()
        p.wait(10)


def check_coordinator_view(directory, res, metric):
    """The coordinator's study agrees with the search's own result."""
    listing, s = coordinator_view(directory, res["study"])
    assert [x["name"] for x in listing["studies"]] == [res["study"]], listing
    assert s["metric"] == metric and s["trial_count"] == len(res["trials"]), s
    mine = {t["number"]: t for t in s["trials"]}
    for t in res["trials"]:
        c = mine[t["number"]]
        assert c["job"] == t["job"] and c["job_name"] == t["job_name"], (c, t)
        assert c["params"] == t["params"], (c, t)
        want = {"complete": "complete", "pruned": "pruned", "fail": "failed"}[t["state"]]
        assert c["state"] == want, (c, t)
        if t["state"] == "complete":
            assert abs(c["value"] - t["value"]) < 1e-9, (c, t)
        assert c["epochs"] == t["epochs"], (c, t)
    assert s["best_trial"] == res["best_trial"], (s, res)
    assert abs(s["best_value"] - res["best_value"]) < 1e-9, (s, res)
    assert s["best_so_far"] and s["best_so_far"][-1]["trial"] == res["best_trial"], s
    return s


def test_bad_input_is_refused_before_any_job(tmp_path):
    cases = [
        ({}, "loss", "min", "non-empty dict"),
        ({"lr": ("log", 0, 1)}, "loss", "min", "low > 0"),
        ({"lr": ("log", 1e-1, 1e-3)}, "loss", "min", "must be below"),
        ({"lr": ("int", 1.5, 4)}, "loss", "min", "whole bounds"),
        ({"lr": ("uniform", 1)}, "loss", "min", "two numbers"),
        ({"lr": {"a": 1}}, "loss", "min", "unknown type"),
        ({"lr": "fast"}, "loss", "min", "unknown distribution"),
        ({"lr": ("log", "1e-3", "lots")}, "loss", "min", "two numbers"),
        ({"lr": {"type": "float", "low": 1}}, "loss", "min", "needs low and high"),
        ({"2lr": [1, 2]}, "loss", "min", "identifiers"),
        ({"lr": ["choice"]}, "loss", "min", "at least one choice"),
        ({"lr": [1, 2]}, "", "min", "metric"),
        ({"lr": [1, 2]}, "loss", "down", "mode"),
    ]
    for space, metric, mode, text in cases:
        with pytest.raises(kolo.tune.TuneError, match=text):
            kolo.tune.run(["true"], space, 2, metric=metric, mode=mode,
                          directory=str(tmp_path / "s"), verbose=False)
    # [choice, a, b] is the list [a, b], as --help writes it
    d = kolo.tune.parse_space({"b": ["choice", 16, 32], "c": [16, 32]})
    assert d["b"].choices == (16, 32) and d["c"].choices == (16, 32)
    with pytest.raises(kolo.tune.TuneError, match="1 to 128 bytes"):
        kolo.tune.run(["true"], {"lr": [1, 2]}, 2, study_name="s" * 129,
                      directory=str(tmp_path / "s"), verbose=False)
    # a placeholder the space lacks
    with pytest.raises(kolo.tune.TuneError, match="not in the space"):
        kolo.tune.run(["echo", "{nope}"], {"lr": [1, 2]}, 2, directory=str(tmp_path / "s"),
                      verbose=False)
    assert not os.path.exists(tmp_path / "s" / "cluster"), "a cluster started anyway"


def test_the_documented_space_files_load(tmp_path):
    # docs/tune.md's space and --help's form, as PyYAML reads them (YAML
    # 1.1: 1e-3 without a dot is a string), and the mapping form other
    # tools write
    import re
    docs = open(os.path.join(ROOT, "docs", "tune.md")).read()
    block = re.search(r"cat > space.yaml <<'EOF'\n(.*?)\nEOF", docs, re.S).group(1)
    (tmp_path / "docs.yaml").write_text(block + "\n")
    d = kolo.tune.load_space_file(str(tmp_path / "docs.yaml"))
    assert d["lr"].log and d["lr"].low == pytest.approx(1e-3) and d["lr"].high == 0.3
    assert d["batch"].choices == (16, 32, 64)
    (tmp_path / "help.yaml").write_text(
        "lr: [log, 1e-4, 1e-1]\nunits: [int, 16, 128]\n"
        "mom: {type: float, low: 0.5, high: 0.99}\n"
        "width: {type: int, low: 8, high: 64, log: true}\n"
        "decay: {type: loguniform, low: 1e-6, high: 1e-2}\n"
        "act: {type: categorical, choices: [relu, tanh]}\n")
    d = kolo.tune.load_space_file(str(tmp_path / "help.yaml"))
    assert d["lr"].log and d["lr"].low == pytest.approx(1e-4) and d["lr"].high == pytest.approx(0.1)
    assert (d["units"].low, d["units"].high, d["units"].log) == (16, 128, False)
    assert (d["mom"].low, d["mom"].high, d["mom"].log) == (0.5, 0.99, False)
    assert (d["width"].low, d["width"].high, d["width"].log) == (8, 64, True)
    assert d["decay"].log and d["decay"].low == pytest.approx(1e-6)
    assert d["act"].choices == ("relu", "tanh")


def test_crashing_trials_fail_and_the_search_goes_on(tmp_path):
    script = tmp_path / "quadratic.py"
    script.write_text(QUADRATIC.replace("EPOCH_S", "0.1"))
    d = str(tmp_path / "study")
    # seed 3 draws x = 0.551, 0.708, 0.291, 0.511: failed, failed, complete, failed
    res = kolo.tune.run(["/usr/bin/python3", str(script), "{x}", os.path.join(ROOT, "python"),
                         "0.5"],
                        {"x": ("uniform", 0.0, 1.0)}, 4, np=1, max_concurrent=2,
                        metric="loss", mode="min", sampler="random", pruner="none", seed=3,
                        directory=d, verbose=False)
    states = [t["state"] for t in res["trials"]]
    assert len(states) == 4 and all(s in ("complete", "fail") for s in states), states
    failed = [t for t in res["trials"] if t["state"] == "fail"]
    done = [t for t in res["trials"] if t["state"] == "complete"]
    assert done and failed, states
    assert all(t["params"]["x"] <= 0.5 for t in done)
    assert all(t["params"]["x"] > 0.5 for t in failed)
    assert all("exit code" in t["error"] for t in failed)
    best = min(done, key=lambda t: t["value"])
    assert res["best_trial"] == best["number"]
    assert res["best_value"] == pytest.approx((best["params"]["x"] - 0.3) ** 2 + 0.25)
    assert max_slots_in_use(d) <= 2
    s = check_coordinator_view(d, res, "loss")
    assert s["states"]["failed"] == len(failed) and s["mode"] == "min", s


def test_function_trainable(tmp_path):
    pkg = os.path.join(ROOT, "python")

    def quad(params):  # defined here, so that cloudpickle ships it by value
        import sys
        sys.path.insert(0, pkg)
        import kolo
        kolo.init()
        for e in range(3):
            kolo.report_epoch(e, metrics={"loss": (params["x"] - 0.3) ** 2 + 1.0 / (e + 1),
                                          "rank": kolo.rank()})
        kolo.shutdown()

    res = kolo.tune.run(quad, {"x": ("uniform", 0.0, 1.0)}, 2, np=2, max_concurrent=1,
                        sampler="random", pruner="none", seed=1,
                        directory=str(tmp_path / "s"), verbose=False)
    assert [t["state"] for t in res["trials"]] == ["complete"] * 2, res["trials"]
    for t in res["trials"]:
        assert t["value"] == pytest.approx((t["params"]["x"] - 0.3) ** 2 + 1.0 / 3)
        assert t["epochs"] == 3


def test_unknown_metric_stops_the_search(tmp_path):
    script = tmp_path / "quadratic.py"
    script.write_text(QUADRATIC.replace("EPOCH_S", "0.1"))
    with pytest.raises(kolo.tune.TuneError, match="without the metric 'accuracy'.*loss"):
        kolo.tune.run(["/usr/bin/python3", str(script), "{x}", os.path.join(ROOT, "python")],
                      {"x": ("uniform", 0.0, 0.5)}, 2, np=1, metric="accuracy",
                      directory=str(tmp_path / "s"), verbose=False)


def test_prune_after_the_trial_ended_counts_as_complete(tmp_path):
    """The pruner may speak at a trial's last epoch, when its job has ended
    already: the stop is refused (409) and the trial completed, for Optuna
    and the coordinator alike. A trial still running is stopped: pruned."""
    TS = optuna.trial.TrialState
    study = optuna.create_study(study_name="race", direction="minimize",
                                pruner=optuna.pruners.ThresholdPruner(upper=-1.0))  # prunes all
    d = str(tmp_path / "race")
    cluster = kolo.tune._Cluster(kolo.tune._kolo_binary(), os.path.join(d, "cluster"), 2)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    script = tmp_path / "report_then.py"
    script.write_text("import sys, time, kolo\nkolo.init()\n"
                      "kolo.report_epoch(0, metrics={'loss': 1.5})\n"
                      "time.sleep(float(sys.argv[1]))\nkolo.shutdown()\n")
    try:
        for number, linger in enumerate(("0", "60")):
            trial = study.ask()
            name = "race/trial-%d" % number
            labels = {"kolo.study": "race", "kolo.trial": str(number), "kolo.params": "{}",
                      "kolo.metric": "loss", "kolo.mode": "min"}
            with open(str(tmp_path / ("t%d.log" % number)), "w") as log:
                proc = cluster.launch(name, 1, None, None,
                                      ["/usr/bin/python3", str(script), linger], env, log, labels)
            rt = kolo.tune._Trial(trial, proc, name, log.name, time.monotonic())
            if linger == "0":
                assert proc.wait(timeout=60) == 0  # the job ended before any poll
            deadline = time.monotonic() + 60
            while not rt.epochs and time.monotonic() < deadline:
                kolo.tune._poll_trial(cluster, study, rt, "loss", TS)
                time.sleep(0.2)
            assert rt.epochs == {0: 1.5}
            assert rt.pruned == (linger != "0"), rt.pruned
            proc.wait(timeout=60)
            kolo.tune._finish_trial(cluster, study, rt, "loss", TS, False, "min")
        assert [t.number for t in study.get_trials(states=(TS.COMPLETE,))] == [0]
        assert [t.number for t in study.get_trials(states=(TS.PRUNED,))] == [1]
        view = cluster.get("/api/v1/studies/race")
        assert [t["state"] for t in sorted(view["trials"], key=lambda t: t["number"])] == \
            ["complete", "pruned"], view
    finally:
        cluster.close()


def test_digits_search_prunes_and_finds_097(tmp_path):
    # Seed 0 draws trial 0 at lr 0.0229, batch 16, hidden 128: 0.9731 after
    # 6 epochs, the best of 12 trials too; trials 2 and 3 (lr ~0.001) fall
    # far below the median of the two before them and are pruned, and so
    # are most of the rest. Six trials are enough to show both.
    d = str(tmp_path / "digits")
    cmd = ["/usr/bin/python3", DIGITS, "--epochs", "6", "--lr", "{lr}", "--batch-size",
           "{batch}", "--hidden", "{hidden}"]
    res = kolo.tune.run(cmd, {"lr": ("log", 1e-3, 0.3), "batch": [16, 32, 64],
                              "hidden": [16, 32, 64, 128]},
                        6, np=2, max_concurrent=2, slots=4, metric="accuracy", mode="max",
                        pruner="median", seed=0, study_name="digits", directory=d,
                        verbose=True)
    states = [t["state"] for t in res["trials"]]
    assert len(states) == 6, states
    assert states.count("pruned") >= 1, states
    assert res["best_value"] >= 0.97, res
    assert all(t["job_name"] == "digits/trial-%d" % t["number"] for t in res["trials"])
    assert max_slots_in_use(d) <= 4
    s = check_coordinator_view(d, res, "accuracy")
    assert s["mode"] == "max" and s["states"]["pruned"] == states.count("pruned"), s


def test_killed_driver_resumes(tmp_path):
    script = tmp_path / "quadratic.py"
    script.write_text(QUADRATIC.replace("EPOCH_S", "0.5"))
    space = tmp_path / "space.yaml"
    space.write_text("x: [uniform, 0.0, 0.8]\n")
    d = str(tmp_path / "study")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    args = ["--trials", "4", "--np", "1", "--max-concurrent", "2", "--space", str(space),
            "--metric", "loss", "--sampler", "random", "--pruner", "none", "--seed", "1",
            "--dir", d]
    cmd = ["/usr/bin/python3", str(script), "{x}", os.path.join(ROOT, "python")]
    driver = subprocess.Popen([os.environ["KOLO_BIN"], "tune", "--study", "resumed"] + args +
                              ["--"] + cmd, env=env, stdout=subprocess.PIPE, text=True)
    seen = []
    for line in driver.stdout:
        seen.append(line)
        if " finished:" in line:
            break
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(1)
    st = optuna.load_study(study_name="resumed", storage="sqlite:///%s/study.db" % d)
    TS = optuna.trial.TrialState
    before = st.get_trials(deepcopy=False)
    assert any(t.state == TS.RUNNING for t in before), [t.state for t in before]
    done_before = [t.number for t in before if t.state == TS.COMPLETE]
    out = subprocess.run([os.environ["KOLO_BIN"], "tune", "--resume", "resumed"] + args +
                         ["--"] + cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "queued again" in out.stdout
    st = optuna.load_study(study_name="resumed", storage="sqlite:///%s/study.db" % d)
    trials = st.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TS.COMPLETE]
    requeued = [t for t in trials if "requeued_from" in t.user_attrs]
    stale = [t for t in trials if t.state == TS.FAIL]
    # every stale trial ran again once, and 4 trials count in all
    assert len(requeued) == len(stale) >= 1
    assert sorted(t.user_attrs["requeued_from"] for t in requeued) == sorted(
        t.number for t in stale)
    for t in requeued:
        assert t.params == trials[t.user_attrs["requeued_from"]].params
    assert len(complete) == 4
    assert set(done_before) <= {t.number for t in complete}
    assert not [t for t in trials if t.state in (TS.RUNNING, TS.WAITING)]


class _TwoHostCluster:
    """A coordinator with a token and three agents of one slot each (ha,
    hb, hc): a running cluster that kolo.tune joins with coordinator= and
    http=, where a 2-worker trial always spans two hosts, one of which can
    leave (drain) under it."""

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.token_file = os.path.join(self.tmp, "token")
        self.token = "tune-" + os.urandom(12).hex()
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (self.token + "\n").encode())
        os.close(fd)
        self.procs = []
        kolo_bin = os.environ["KOLO_BIN"]
        coord = subprocess.Popen([kolo_bin, "coordinator", "--listen", "tcp://127.0.0.1:0",
                                  "--http", "127.0.0.1:0", "--db", os.path.join(self.tmp, "c.db"),
                                  "--token-file", self.token_file, "--lease", "3s",
                                  "--heartbeat", "300ms"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(coord)
        line = coord.stdout.readline()
        assert "http=" in line, line
        self.rpc = line.split("rpc=")[1].split()[0]
        self.http = line.split("http=")[1].split()[0]
        for name, slots in (("ha", 1), ("hb", 1), ("hc", 1)):
            self.procs.append(subprocess.Popen(
                [kolo_bin, "agent", "--coordinator", self.rpc, "--slots", str(slots), "--name",
                 name, "--state-dir", os.path.join(self.tmp, "agent-" + name), "--token-file",
                 self.token_file], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.wait(30, "three live hosts", lambda: sum(
            h["state"] == "alive" for h in self.get("/api/v1/hosts")["hosts"]) == 3)

    def get(self, path):
        return json.loads(urllib.request.urlopen(self.http + path, timeout=10).read())

    def post(self, path):
        req = urllib.request.Request(self.http + path, data=b"", method="POST")
        req.add_header("Authorization", "Bearer " + self.token)
        return json.loads(urllib.request.urlopen(req, timeout=10).read())

    @staticmethod
    def wait(seconds, what, fn):
        deadline = time.time() + seconds
        while not fn():
            assert time.time() < deadline, "timed out waiting for " + what
            time.sleep(0.1)

    def close(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


ELASTIC_DIGITS = os.path.join(ROOT, "examples", "pytorch", "elastic_digits.py")


def test_elastic_trials_fill_free_slots_and_shrink_when_a_host_leaves(tmp_path):
    """Elastic trials (np 2, min 1, max 2) on a running cluster of three
    1-slot hosts, 2 at once: the first takes two hosts, the second starts
    on the one slot left (kolo.tune sizes it to what is free); draining one
    host of the first shrinks it to one worker at its next commit, a trial
    grows when slots come free, and every trial completes."""
    import threading
    cl = _TwoHostCluster(tmp_path)
    try:
        out = {}
        cmd = ["/usr/bin/python3", ELASTIC_DIGITS, "--epochs", "6", "--step-delay", "0.03",
               "--lr", "{lr}", "--hidden", "32"]
        search = threading.Thread(target=lambda: out.update(res=kolo.tune.run(
            cmd, {"lr": ["choice", 0.02, 0.05]}, 3, np=2, min_np=1, max_np=2, max_concurrent=2,
            metric="loss", mode="min", sampler="random", pruner="none", seed=2,
            coordinator=cl.rpc, http=cl.http, token_file=cl.token_file, study_name="elastic",
            directory=str(tmp_path / "study"), verbose=True)))
        search.start()

        def trials():
            return [j for j in cl.get("/api/v1/jobs")["jobs"]
                    if j["metadata"].get("kolo.study") == "elastic"]

        # both first trials run at once on 3 slots: 2 + 1
        cl.wait(90, "two trials running on all 3 slots", lambda: sorted(
            j["ranks_alive"] for j in trials() if j["state"] == "running") == [1, 2])
        # one host of the 2-worker trial leaves: the trial shrinks
        def hosts_of(jid):
            return sorted(r["host_name"] for r in cl.get("/api/v1/jobs/%d" % jid)["ranks"]
                          if r["state"] == "running")
        spans = [j["id"] for j in trials() if j["state"] == "running" and j["ranks_alive"] == 2]
        assert len(spans) == 1, [(j["id"], hosts_of(j["id"])) for j in trials()]
        left = hosts_of(spans[0])[0]
        cl.post("/api/v1/hosts/%s/drain" % left)

        def shrunk():
            return any("drain" in g["cause"] and g["size"] == 1 for g in
                       cl.get("/api/v1/jobs/%d/generations" % spans[0])["generations"])
        cl.wait(60, "the trial to leave the drained host", shrunk)
        # the host comes back: a running trial grows into it
        cl.post("/api/v1/hosts/%s/undrain" % left)
        search.join(240)
        assert not search.is_alive(), "the search did not end"
        res = out["res"]
        assert [t["state"] for t in res["trials"]] == ["complete"] * 3, res["trials"]
        jobs = {j["id"]: j for j in trials()}
        assert all(j["elastic"] and j["state"] == "succeeded" for j in jobs.values()), jobs
        # a trial grew back to 2 workers in a later generation
        grew = [jid for jid in jobs if any(
            g["size"] == 2 and g["generation"] > 1
            for g in cl.get("/api/v1/jobs/%d/generations" % jid)["generations"])]
        assert grew, {jid: cl.get("/api/v1/jobs/%d/generations" % jid) for jid in jobs}
        s = cl.get("/api/v1/studies/elastic")
        assert s["states"]["complete"] == 3, s
    finally:
        cl.close()


def test_a_cluster_without_a_token(tmp_path):
    """kolo tune against a coordinator started by hand without --token-file
    (admin calls for its own user over RPC, no REST writes): a pruned
    trial is stopped with `kolo stop` over RPC, and a refused REST call
    says the coordinator's reason, not a bare "HTTP Error 403"."""
    kb = kolo.tune._kolo_binary()
    coord = subprocess.Popen([kb, "coordinator", "--listen", "tcp://127.0.0.1:0", "--http",
                              "127.0.0.1:0", "--db", str(tmp_path / "c.db"), "--log-level",
                              "warn"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    agent = None
    try:
        line = coord.stdout.readline()
        rpc, http = line.split("rpc=")[1].split()[0], line.split("http=")[1].split()[0]
        agent = subprocess.Popen([kb, "agent", "--coordinator", rpc, "--slots", "1", "--name",
                                  "solo", "--state-dir", str(tmp_path / "agent"), "--log-level",
                                  "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cluster = kolo.tune._Cluster(kb, str(tmp_path / "unused"), 1, coordinator=rpc, http=http)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        with open(str(tmp_path / "t.log"), "w") as log:
            proc = cluster.launch("bare/trial-0", 1, None, None,
                                  ["/usr/bin/python3", "-c", "import time; time.sleep(60)"],
                                  env, log, {"kolo.study": "bare"})
        deadline = time.monotonic() + 30
        job = None
        while job is None and time.monotonic() < deadline:
            job = cluster.job_id("bare/trial-0")
            time.sleep(0.2)
        assert job, "the trial's job never showed up"
        with pytest.raises(kolo.tune.CoordinatorError) as info:
            cluster.request("POST", "/api/v1/jobs/%d/stop" % job, {"reason": "x"})
        assert info.value.code == 403 and "token" in str(info.value).lower(), str(info.value)
        assert cluster.stop(job, "pruned by the test") is True
        assert proc.wait(timeout=30) != 0
        assert cluster.get("/api/v1/jobs/%d" % job)["state"] == "stopped"
        assert cluster.stop(job, "again") is False  # already ended
    finally:
        for p in (agent, coord):
            if p:
                p.terminate()
                p.wait(10)
