"""Elastic training under faults, with real `kolo run` jobs.

Workers kill themselves with SIGKILL at planned steps (the plan is seeded
and logged; a marker file makes each kill happen once even when the step
is replayed after a rollback). Every rank trains on the same batch at each
step, so the averaged gradient does not depend on how many workers there
are: a run with kills must end with the weights of a fault-free run, up to
float rounding. That is the check that no step was lost or applied twice
beyond the rollback to the last commit.
"""
import json
import os
import random
import re
import shutil
import statistics
import tempfile

import pytest

from conftest import kolo_run

torch = pytest.importorskip("torch")

WORKER = r'''
import json, os, signal, sys, time
born = time.time()
import torch
import kolo.torch as hvd

hvd.init()
print("BORN pid %d t %.3f" % (os.getpid(), born), flush=True)
steps, commit_every = int(sys.argv[1]), int(sys.argv[2])
kills = json.loads(sys.argv[3])      # [[step, rank % size], ...]; rank -1: every rank
marks = sys.argv[4]
delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
hold = int(sys.argv[6]) if len(sys.argv) > 6 else 0  # before the last step, wait to be this many

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
state.register_reset_callbacks([lambda: print("RESET size %d step %d t %.3f"
                                              % (hvd.size(), state.step, time.time()), flush=True)])
started = time.time()


def batch(step):
    g = torch.Generator()
    g.manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g)
    return x, x @ torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64


def maybe_die():
    for i, kill in enumerate(kills):
        s, victim = kill[0], kill[1]
        how = kill[2] if len(kill) > 2 else "kill"  # "raise": a Python exception instead
        if state.step != s or (victim >= 0 and hvd.rank() != victim % hvd.size()):
            continue
        if victim < 0 and int(os.environ["KOLO_WORKER_ID"]) > hvd.size():
            continue  # -1 kills the workers the job started with, not their successors
        tag = "kill%d" % i if victim >= 0 else "kill%d.%d" % (i, int(os.environ["KOLO_WORKER_ID"]))
        try:
            os.close(os.open(os.path.join(marks, tag), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        print("KILL %d step %d rank %d t %.3f" % (i, s, hvd.rank(), time.time()), flush=True)
        if how == "raise":  # escapes hvd.elastic.run: the worker exits 1
            raise RuntimeError("planned failure %d on rank %d" % (i, hvd.rank()))
        # "stop": frozen (SIGSTOP), alive but never going on
        os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)


@hvd.elastic.run
def train(state):
    if state.step:
        print("RESUMED step %d size %d" % (state.step, hvd.size()), flush=True)
    while state.step < steps:
        maybe_die()
        if state.step == steps - 1 and hvd.size() < hold:
            # growing back waits for a spare to reach hvd.init() (seconds
            # under a loaded CI): hold the last step for it, bounded
            until = time.time() + 90
            while hvd.size() < hold and time.time() < until:
                time.sleep(0.1)
                state.commit()  # saves, then checks (a bare check would keep the
                # model but sync the step back to the last commit: as Horovod)
        x, y = batch(state.step)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        state.step += 1
        print("STEP %d size %d t %.3f" % (state.step, hvd.size(), time.time()), flush=True)
        if state.step % commit_every == 0:
            state.commit()
        if delay:
            time.sleep(delay)


train(state)
w = torch.cat([p.detach().flatten() for p in model.parameters()])
print("FINAL %d %s" % (state.step, json.dumps(w.tolist())), flush=True)
'''


def run(np, kills, steps=60, commit=5, kolo_args=(), timeout=240, delay=0.0, hold=0):
    marks = tempfile.mkdtemp(prefix="kolo-kills-")
    try:
        return kolo_run(np, WORKER, args=(steps, commit, json.dumps(kills), marks, delay, hold),
                        kolo_args=kolo_args, timeout=timeout)
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def finals(job):
    out = []
    for line in job.lines():
        if line.startswith("FINAL "):
            _, step, w = line.split(" ", 2)
            out.append((int(step), json.loads(w)))
    return out


def timeline(job):
    """(time, kind, size) of every KILL, RESET and STEP line, in time order."""
    events = []
    for line in job.lines():
        m = re.match(r"(KILL|RESET|STEP) .* t ([0-9.]+)$", line)
        if m:
            size = re.search(r" size (\d+) ", line)
            events.append((float(m.group(2)), m.group(1), int(size.group(1)) if size else 0))
    events.sort()
    return events


def recovery_times(job):
    """Seconds from each kill to the first step of the generation after it."""
    times, killed, reset = [], None, False
    for t, kind, _ in timeline(job):
        if kind == "KILL" and killed is None:
            killed, reset = t, False
        elif kind == "RESET" and killed is not None:
            reset = True
        elif kind == "STEP" and killed is not None and reset:
            times.append(t - killed)
            killed = None
    return times


@pytest.fixture(scope="module")
def reference():
    """The weights of a fault-free run of WORKER's 60 steps, computed here
    with plain torch (same seed, model, batches and optimizer): what a job
    of any size must end with, since every rank trains on the same batch.
    This process has torch loaded already, so no job starts for it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(60):
        g = torch.Generator()
        g.manual_seed(1000 + step)
        x = torch.randn(32, 16, generator=g)
        y = x @ torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def test_killed_workers_are_replaced_and_the_model_matches(reference):
    rng = random.Random(5)
    kills = sorted([[s, rng.randrange(0, 3)] for s in rng.sample(range(8, 50), 3)])
    print("kill plan (step, rank):", kills)
    job = run(4, kills, kolo_args=("--min-np", "2", "--max-np", "4",
                                   "--blacklist-cooldown-range", "1", "1"), delay=0.05, hold=4)
    assert job.rc == 0, job
    got = finals(job)
    assert len(got) >= 2, job
    for step, w in got:
        assert step == 60
        assert close(w, reference), (w, reference)
    killed = [ln for ln in job.lines() if ln.startswith("KILL")]
    assert len(killed) == 3, killed
    rec = recovery_times(job)
    print("recovery s: %s (p50 %.3f)" % (rec, statistics.median(rec)))
    assert len(rec) == 3
    # kolo run said where each recovery's time went (issue 32): one line per
    # kill that reset the job, its parts adding up to the total
    said = re.findall(r"\[kolo\] job \d+ recovered in ([0-9.]+) s from: rank \d+ on host \S+ was "
                      r"killed by signal 9\. Survivors told ([0-9.]+) s after the coordinator "
                      r"detected it, generation \d+ formed ([0-9.]+) s later, state restored "
                      r"in ([0-9.]+) s, first step done ([0-9.]+) s after that", job.err)
    assert 1 <= len(said) <= 3, job.err
    for total, *parts in said:
        assert abs(float(total) - sum(map(float, parts))) < 0.02 and float(total) < 30, said
    # it shrank after the first kill and grew back to four workers later
    first_kill = min(t for t, kind, _ in timeline(job) if kind == "KILL")
    after = [n for t, kind, n in timeline(job) if kind == "STEP" and t > first_kill]
    assert 3 in after and 4 in after, after


def test_rank_zero_dies_and_a_survivor_takes_over(reference):
    job = run(3, [[12, 0]], kolo_args=("--min-np", "2", "--max-np", "3", "--quiet"))
    assert job.rc == 0, job
    assert [s for s, _ in finals(job)] == [60, 60], job
    # --quiet: no line for the kill, the new generation or the recovery
    assert not re.search(r"\[kolo\] (rank \d+ on host|job \d+ (generation|recovered)|host )",
                         job.err), job.err
    for _, w in finals(job):
        assert close(w, reference)


def test_below_min_np_fails_after_the_elastic_timeout():
    # no cooldown range: the host stays excluded, so no replacement comes
    job = run(2, [[6, 1]], steps=1000, kolo_args=("--min-np", "2", "--elastic-timeout", "3"),
              delay=0.01, timeout=90)
    assert job.rc != 0, job
    assert "elastic timeout" in job.err, job


def test_below_min_np_waits_and_goes_on_when_capacity_returns(reference):
    job = run(2, [[10, 1]], kolo_args=("--min-np", "2", "--blacklist-cooldown-range", "2", "2"))
    assert job.rc == 0, job
    assert [s for s, _ in finals(job)] == [60, 60], job
    for _, w in finals(job):
        assert close(w, reference)


def test_all_workers_die_and_the_job_goes_on_from_the_durable_snapshot(reference):
    job = run(2, [[30, -1]], kolo_args=("--min-np", "2", "--blacklist-cooldown-range", "1", "1"),
              delay=0.05)
    assert job.rc == 0, job
    resumed = [int(ln.split()[2]) for ln in job.lines() if ln.startswith("RESUMED")]
    assert resumed and 20 <= min(resumed) <= 30, resumed
    assert [s for s, _ in finals(job)] == [60, 60], job
    for _, w in finals(job):
        assert close(w, reference)


def test_reset_limit_fails_the_job():
    job = run(3, [[8, 1], [20, 1]], steps=200,
              kolo_args=("--min-np", "1", "--max-np", "3", "--reset-limit", "1"))
    assert job.rc != 0, job
    assert "reset limit" in job.err, job


def test_elastic_sampler_splits_what_is_left():
    import kolo.torch as hvd
    from kolo.torch.elastic import ElasticSampler

    data = list(range(103))
    s = ElasticSampler(data, shuffle=True, seed=3)
    s.set_epoch(2)

    def shards(n, sampler):
        out = []
        for r in range(n):
            sampler.num_replicas, sampler.rank = n, r
            sampler.num_samples = -(-len(sampler.remaining_indices) // n)
            sampler.total_size = sampler.num_samples * n
            out.append(list(iter(sampler)))
        return out

    first = shards(4, s)
    # 3 batches of 5 on each of 4 ranks, then a reset to 3 ranks
    done = set()
    for r in range(4):
        done.update(first[r][:15])
    s.num_replicas = 4
    for b in range(3):
        s.record_batch(b, 5)
    state = s.state_dict()
    s2 = ElasticSampler(data, shuffle=True, seed=3)
    s2.load_state_dict(state)
    rest = shards(3, s2)
    seen = set()
    for sh in rest:
        seen.update(sh)
    assert not (seen & done), "a sample of the first part came again"
    assert seen | done == set(data), "a sample was skipped"
    assert hvd.is_initialized() is False


EPOCHS_WORKER = r'''
import os, sys, time, torch
import kolo.torch as hvd
marks = sys.argv[1]
hvd.init()
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, epoch=0)

@hvd.elastic.run
def train(state):
    while state.epoch < 3:
        while state.step < 20 * (state.epoch + 1):
            opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
            mark = os.path.join(marks, "killed")
            if state.step == 30 and hvd.rank() == 1 and not os.path.exists(mark):
                open(mark, "w").close()
                os.kill(os.getpid(), 9)
            time.sleep(0.02)
        hvd.report_epoch(state.epoch, samples=20, metrics={"loss": 0.5})
        state.epoch += 1
        state.commit()

train(state)
'''


def test_an_epoch_cut_by_a_reset_is_marked():
    """kolo run's epoch lines say which epoch a reset cut (issue 32), and
    REST's /epochs counts them ("resets")."""
    marks = tempfile.mkdtemp(prefix="kolo-test-epochs-")
    try:
        job = kolo_run(2, EPOCHS_WORKER, args=(marks,), timeout=90,
                       kolo_args=("--min-np", "1", "--max-np", "2",
                                  "--blacklist-cooldown-range", "60", "61"))
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    assert job.rc == 0, job
    lines = [ln for ln in job.err.splitlines() if ln.startswith("[kolo] epoch ")]
    # epoch 0 too: the survivor's report of it went as the reset closed its
    # generation (it used to be refused as stale, and the epoch was missing)
    assert [ln.split(":")[0] for ln in lines] == ["[kolo] epoch %d" % e for e in range(3)], job.err
    assert "reset" not in lines[0] and "reset" not in lines[2], lines
    assert lines[1].endswith("(cut by 1 elastic reset: the time since the last, generation 2)"), lines


def test_a_hot_spare_takes_a_killed_ranks_place(reference, tmp_path):
    """--spares 1 (issue 32): a spare waits in hvd.init(); when a rank is
    killed the next generation takes it - back at full size without a
    process start (the new rank's process was born before the kill) - it
    gets the committed state like any new rank (the weights match a run
    without failures), and a new spare starts in its place."""
    state = tmp_path / "state"
    marks = tempfile.mkdtemp(prefix="kolo-kills-")
    try:
        job = kolo_run(3, WORKER, args=(60, 5, json.dumps([[20, 1]]), marks, 0.05),
                       kolo_args=("--min-np", "2", "--max-np", "3", "--spares", "1",
                                  "--blacklist-cooldown-range", "1", "1"),
                       timeout=240, state_dir=str(state))
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    assert job.rc == 0, job
    got = finals(job)
    assert [s for s, _ in got] == [60, 60, 60], job
    assert all(close(w, reference) for _, w in got)
    m = re.search(r"^\[kolo\] job \d+ generation 2 took 1 hot spare\(s\), no process start: "
                  r"worker (\d+) on localhost$", job.err, re.M)
    assert m, job.err
    # back at full size at once: no step of 2 ranks after the kill
    kill_t = min(t for t, kind, _ in timeline(job) if kind == "KILL")
    after = [n for t, kind, n in timeline(job) if kind == "STEP" and t > kill_t]
    assert after and set(after) == {3}, after
    # the process in the killed rank's place was born before the kill
    born = {int(p): float(t) for p, t in re.findall(r"BORN pid (\d+) t ([0-9.]+)", job.out)}
    assert len(born) == 4, job.out
    assert sorted(born.values())[-1] < kill_t, (born, kill_t)
    # a new spare started in its place once the host's cooldown passed (a
    # spare is a new process: exclusion keeps it off for that long): two
    # spare starts in the job's events
    import sqlite3
    db = next(state.rglob("run-*.db"))
    kinds = [k for (k,) in sqlite3.connect(str(db)).execute(
        "SELECT kind FROM events WHERE kind LIKE 'worker.spare%'")]
    assert kinds.count("worker.spare_started") == 2, kinds
