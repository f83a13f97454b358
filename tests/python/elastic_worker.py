"""An elastic training worker for kolo's fault tests and the recovery bench.

    elastic_worker.py --steps N --commit K [--delay S] [--kills JSON --marks DIR]

Every rank trains a small linear model on the *same* batch at each step (a
seeded function of the step), with a learning rate that decays with the
steps, so the averaged gradient does not depend on how many workers there
are: whatever faults happen, a run that finishes must end with the weights
of a fault-free run, up to float rounding (a rollback that left the model,
the optimizer or the schedule behind would not).

It prints, each line flushed and stamped with time.time():
  STEP <step> size <n> gen <g> wid <w> host <host id> t <t>   after each step
  RESET size <n> step <s> gen <g> wid <w> t <t>              after each reset
  KILL <i> step <s> rank <r> wid <w> t <t>                    before a planned kill
  FINAL <step> <weights as JSON>                               at the end

Planned kills (--kills '[[step, rank], ...]', rank -1: every rank) make the
worker SIGKILL itself (SIGSTOP for [step, rank, "stop"]: frozen, alive but
never going on) when it is at that step with that rank (rank taken
modulo the current size); a marker file under --marks makes each kill
happen once even when the step is replayed after a rollback. With
--kill-min-size N the step of a kill counts from the start of a generation
of N workers instead: kill i fires once such a generation, later than the
one kill i-1 happened in, has trained that many steps (a steady-state
measure: every kill hits a full-size job that has been training a while).

--stop-file PATH: the worker leaves its loop (at a commit) once PATH exists,
so a test can end an otherwise long job at a chosen time; the final step is
then whatever was reached, and the job still succeeds.
"""
import argparse
import faulthandler
import json
import os
import signal
import time

import torch

import kolo.torch as hvd

# SIGUSR1 prints every thread's Python stack (tests/integration/lib.sh sends
# it to the workers of a failed test before it kills them); so does the
# SIGTERM of an agent stopping a worker (a frozen one: what it waited for).
faulthandler.register(signal.SIGUSR1, all_threads=True)
faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


TARGET = torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64


def batch(step):
    """The batch of a step: the same on every rank and in every run."""
    g = torch.Generator()
    g.manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g)
    return x, x @ TARGET


def new_model():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def new_schedule(opt):
    """The learning rate decays with the steps: a run rolled back to a
    commit must roll its schedule back too (TorchState's scheduler
    handler), or its final weights differ from a fault-free run's."""
    return torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def reference(steps):
    model, opt = new_model()
    sched = new_schedule(opt)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        sched.step()
    print("FINAL %d %s" % (steps, json.dumps(weights(model))), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--commit", type=int, default=5)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--kills", default="[]")
    ap.add_argument("--marks", default="")
    ap.add_argument("--kill-min-size", type=int, default=0,
                    help="a planned kill waits (past its step) until the job has this many "
                         "workers and the kill before it happened")
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--tag", default="", help="ignored: a marker for pgrep")
    ap.add_argument("--reference", action="store_true",
                    help="train --steps steps in this process alone, without kolo, and print FINAL")
    a = ap.parse_args()
    if a.reference:
        return reference(a.steps)
    kills = json.loads(a.kills)
    wid = os.environ.get("KOLO_WORKER_ID", "0")
    host = os.environ.get("KOLO_HOST_ID", "-")[:8]

    hvd.init()
    model, sgd = new_model()
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    sched = new_schedule(opt)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, lr_scheduler=sched, step=0,
                                   stop=False)

    def gen():
        # the generation this process is in now (the engine's view)
        from kolo import _eng
        return int(_eng().generation())

    def on_reset():
        print("RESET size %d step %d gen %d wid %s t %.3f"
              % (hvd.size(), state.step, gen(), wid, time.time()), flush=True)

    state.register_reset_callbacks([on_reset])

    def killed_in(tag):
        """The generation a kill happened in (its marker holds it), or None."""
        try:
            with open(os.path.join(a.marks, tag)) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return None

    def maybe_die():
        for i, kill in enumerate(kills):
            s, victim = kill[0], kill[1]
            if victim >= 0 and hvd.rank() != victim % hvd.size():
                continue
            if a.kill_min_size:
                prev = killed_in("kill%d" % (i - 1)) if i else -1
                if state.step - since[0] < s or hvd.size() < a.kill_min_size \
                        or prev is None or prev >= gen():
                    continue
            elif state.step != s:
                continue
            tag = "kill%d" % i if victim >= 0 else "kill%d.%s" % (i, wid)
            # the marker appears complete or not at all: written aside, then
            # linked into place (link fails if another process got there first)
            tmp = os.path.join(a.marks, ".%s.%d" % (tag, os.getpid()))
            with open(tmp, "w") as f:
                f.write("%d" % gen())
            try:
                os.link(tmp, os.path.join(a.marks, tag))
            except FileExistsError:
                continue
            finally:
                os.unlink(tmp)
            print("KILL %d step %d rank %d wid %s t %.3f" % (i, state.step, hvd.rank(), wid,
                                                             time.time()),
                  flush=True)
            # [step, rank, "stop"]: frozen (SIGSTOP), alive but never going on
            stop = len(kill) > 2 and kill[2] == "stop"
            os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)

    since = [0]   # the step this generation started training at

    @hvd.elastic.run
    def train(state):
        since[0] = state.step
        while state.step < a.steps and not state.stop:
            maybe_die()
            x, y = batch(state.step)
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            sched.step()
            state.step += 1
            print("STEP %d size %d gen %d wid %s host %s t %.3f"
                  % (state.step, hvd.size(), gen(), wid, host, time.time()), flush=True)
            if state.step % a.commit == 0:
                if a.stop_file:
                    # rank 0 decides for all: every rank must leave together
                    state.stop = hvd.broadcast_object(os.path.exists(a.stop_file), 0,
                                                      name="stop")
                state.commit()
            if a.delay:
                time.sleep(a.delay)

    train(state)
    print("FINAL %d %s" % (state.step, json.dumps(weights(model))), flush=True)


if __name__ == "__main__":
    main()
