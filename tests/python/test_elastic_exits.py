"""Horovod's exit schedules for elastic jobs (issue 30, item 3), in a
file of their own beside test_elastic.py (whose worker, reference run and
checks they use): a rank whose training function raises, replaced like a
SIGKILLed one; the blacklist cooldown backing off (LO, 2 LO, 4 LO, ... at
most HI) over repeated failures of one host; a rank stopped by a signal
(alive, never going on) taken as frozen within seconds (issue 31)."""
import re

import pytest

pytest.importorskip("torch")

from test_elastic import close, finals, recovery_times, reference, run  # noqa: E402,F401


def test_a_rank_that_raises_is_replaced_like_a_killed_one(reference):
    # Horovod's exit schedules fail a rank either way (an exception out of
    # the training function, or SIGKILL): both are a failed worker, whose
    # host sits out its cooldown while the others restore the last commit
    # and go on; here the exception's worker exits 1 with its traceback
    job = run(3, [[12, 1, "raise"], [30, 2]],
              kolo_args=("--min-np", "2", "--max-np", "3",
                         "--blacklist-cooldown-range", "1", "1"), delay=0.05)
    assert job.rc == 0, job
    assert "RuntimeError: planned failure 0 on rank 1" in job.err, job
    # kolo run tells each loss and each new generation (not only --verbose)
    notices = [ln for ln in job.err.splitlines() if ln.startswith("[kolo] ")]
    assert any(re.match(r"\[kolo\] rank \d+ on host \S+ exited with code 1: "
                        r"RuntimeError: planned failure 0 on rank 1$", ln)
               for ln in notices), job.err
    assert any(re.match(r"\[kolo\] rank \d+ on host \S+ was killed by signal 9$", ln)
               for ln in notices), job.err
    assert len([ln for ln in notices if re.match(r"\[kolo\] job \d+ generation \d+: ", ln)]) >= 2, \
        job.err
    assert len([ln for ln in job.lines() if ln.startswith("KILL")]) == 2, job
    assert len(recovery_times(job)) == 2, job
    got = finals(job)
    assert len(got) >= 2, job
    for step, w in got:
        assert step == 60 and close(w, reference), (step, w, reference)


def test_cooldown_backs_off(reference):
    # --blacklist-cooldown-range LO HI: the n-th exclusion of a host lasts
    # LO * 2^(n-1) seconds (up to 25% more, jitter), at most HI
    job = run(3, [[10, 1], [25, 1], [40, 2], [50, 1]],
              kolo_args=("--min-np", "2", "--max-np", "3",
                         "--blacklist-cooldown-range", "1", "3"), delay=0.05)
    assert job.rc == 0, job
    # told by kolo run itself, without --verbose
    got = [(int(n), float(s)) for s, n in
           re.findall(r"^\[kolo\] host localhost excluded from job \d+ for ([0-9.]+) s "
                      r"\(exclusion (\d+)\)", job.err, re.M)]
    assert [n for n, _ in got] == [1, 2, 3, 4], job.err
    for n, secs in got:
        base = min(3.0, 1.0 * 2 ** (n - 1))
        assert base <= secs <= min(3.0, base * 1.25) + 0.05, got
    assert [s for s, _ in finals(job)] and all(close(w, reference) for _, w in finals(job))


def test_a_stopped_rank_is_frozen_within_seconds(reference):
    # SIGSTOP: the process lives, its peers wait on it; the agent sees it
    # stopped (state T) and after 8 s the job goes on without it, from the
    # last commit, to the fault-free weights; kolo run says why
    job = run(2, [[12, 1, "stop"]],
              kolo_args=("--min-np", "1", "--max-np", "2",
                         "--blacklist-cooldown-range", "600", "600"), delay=0.05)
    assert job.rc == 0, job
    said = [ln for ln in job.err.splitlines()
            if re.match(r"\[kolo\] rank 1 \(pid \d+\) on host \S+ has been stopped by a signal "
                        r"for \d+ s .*stopped as frozen", ln)]
    assert said, job.err
    times = recovery_times(job)
    # 8 s stopped, then the reset (13.6 s in all on a quiet machine; the
    # bound leaves room for a loaded CI, far below the 600 s elastic timeout)
    assert len(times) == 1 and 8 <= times[0] <= 30, times
    got = finals(job)
    assert got and all(step == 60 and close(w, reference) for step, w in got), job


def test_every_rank_raising_fails_the_job_at_once():
    # Horovod's all-ranks-failure schedule: the same exception on every
    # rank is the script's fault; the job fails now with the first error
    # (its text from the rank's traceback) instead of waiting for capacity
    # for --elastic-timeout (600 s)
    import time
    t0 = time.time()
    job = run(3, [[12, -1, "raise"]], steps=40,
              kolo_args=("--min-np", "2", "--max-np", "3"), delay=0.05, timeout=120)
    took = time.time() - t0
    assert job.rc == 1, job
    assert took < 60, took
    last = [ln for ln in job.err.splitlines() if ln.startswith("[kolo] job ")][-1]
    assert re.search(r"failed: every worker failed with an error of its own .* the first: rank \d+ "
                     r"on host \S+ exited with code 1: RuntimeError: planned failure 0 on rank \d+",
                     last), job.err
    # each failure is told as it happens, with its error
    assert re.search(r"^\[kolo\] rank \d+ on host \S+ exited with code 1: RuntimeError: ",
                     job.err, re.M), job.err


def test_a_killed_rank_is_not_the_codes_fault():
    # all ranks gone, but by SIGKILL (a lost machine, a spot reclaim): the
    # job keeps waiting for capacity with the reason shown (here until
    # its elastic timeout), it does not fail as a code error would
    job = run(2, [[12, -1]], steps=40,
              kolo_args=("--min-np", "2", "--max-np", "2", "--elastic-timeout", "8"),
              delay=0.05, timeout=120)
    assert job.rc != 0, job
    assert "every worker failed" not in job.err, job.err
    assert re.search(r"^\[kolo\] waiting for capacity: ", job.err, re.M), job.err


SAME_ERROR_WORKER = r'''
import time, torch
import kolo.torch as hvd
hvd.init()
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

@hvd.elastic.run
def train(state):
    while state.step < 100000:
        opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        if hvd.size() > 1 and hvd.rank() == 1 and state.step % 10 == 7:
            raise ValueError("corrupt shard on rank 1")   # a bug: every time
        time.sleep(0.02)

train(state)
'''


def test_the_same_error_every_time_fails_the_job():
    # one rank's data is broken: every replacement raises the same error
    # at the same place. Without a --reset-limit of the user's the job
    # fails at the third time in a row, with the error, instead of
    # resetting forever
    import time
    from conftest import kolo_run
    t0 = time.time()
    job = kolo_run(2, SAME_ERROR_WORKER, timeout=120,
                   kolo_args=("--min-np", "1", "--max-np", "2",
                              "--blacklist-cooldown-range", "1", "1"))
    took = time.time() - t0
    assert job.rc == 1, job
    assert took < 90, took
    assert len(re.findall(r"^\[kolo\] rank 1 on host \S+ exited with code 1: "
                          r"ValueError: corrupt shard on rank 1$", job.err, re.M)) == 3, job.err
    last = [ln for ln in job.err.splitlines() if ln.startswith("[kolo] job ")][-1]
    assert re.search(r"failed: the same error ended a worker 3 times in a row, the last: rank 1 "
                     r"on host \S+ exited with code 1: ValueError: corrupt shard on rank 1; ", last), \
        job.err
