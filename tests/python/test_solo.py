"""A program started without kolo run (no KOLO_COORDINATOR) runs alone, as
rank 0 of 1, as under Horovod: libkolo's one-rank context runs every
collective through the same calls as a job's (worker/runtime/solo.c). Each test
starts a script alone, as a user would, and checks the one-rank results
against numpy/torch."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HOROVOD_SUITE, PYDIR


def _run_alone(tmp_path, args, env=None):
    """Runs this Python with args alone: none of a job's variables, kolo
    on the path."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("KOLO_", "HOROVOD_")) or k == "KOLO_LIBRARY"}
    e["PYTHONPATH"] = PYDIR
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(env or {})
    p = subprocess.run([sys.executable] + args, cwd=str(tmp_path), env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240,
                       universal_newlines=True)
    print(p.stdout)
    return p


def _alone(tmp_path, code, env=None):
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent(code))
    return _run_alone(tmp_path, [str(script)], env)


NUMPY = r'''
import numpy as np
import kolo

kolo.init()
assert (kolo.rank(), kolo.size(), kolo.local_rank(), kolo.local_size(),
        kolo.cross_rank(), kolo.cross_size()) == (0, 1, 0, 1, 0, 1)
OPS = [kolo._engine.Average, kolo._engine.Sum, kolo._engine.Min, kolo._engine.Max,
       kolo._engine.Product]
DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


def values(dt, n):
    x = np.arange(n) % 13
    return (x if dt == np.uint8 else x - 6).astype(dt)


def scaled(x, pre, post):
    # prescale, then postscale; integers truncate at each step
    if np.issubdtype(x.dtype, np.floating):
        return (x.astype(np.float64) * pre * post).astype(x.dtype)
    return np.trunc(np.trunc(x.astype(np.float64) * pre) * post).astype(x.dtype)


for dt in DTYPES:
    for n in (0, 1, 7, 4099):
        x = values(dt, n)
        for op in OPS:
            for pre, post in ((1.0, 1.0), (3.0, 0.5)):
                got = kolo.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
                assert got.dtype == x.dtype and np.array_equal(got, scaled(x, pre, post)), \
                    (dt, n, op, pre, post, got[:5])
        rows = x.reshape(-1, 1)
        assert np.array_equal(kolo.allgather(rows), rows)
        assert np.array_equal(kolo.broadcast(x, 0), x)
        assert np.array_equal(kolo.alltoall(rows), rows)
        out, recv = kolo.alltoall(rows, splits=[n // 2])
        assert np.array_equal(out, rows[:n // 2]) and list(recv) == [n // 2]
        for op in (kolo._engine.Sum, kolo._engine.Average):
            got = kolo.reducescatter(rows, op=op, prescale_factor=3.0, postscale_factor=0.5)
            assert np.array_equal(got, scaled(rows, 3.0, 0.5)), (dt, n, op)

a, b = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.int64)
ga, gb = kolo.grouped_allreduce([a, b], op=kolo._engine.Sum)
assert np.array_equal(ga, a) and np.array_equal(gb, b)
h = kolo.allreduce_async(a, name="polled")
while not kolo.poll(h):
    pass
assert np.array_equal(kolo.synchronize(h), a)
try:
    kolo.broadcast(a, 1)
except ValueError as e:
    assert "root 1" in str(e), e
else:
    raise SystemExit("broadcast from rank 1 of 1 was accepted")
kolo.barrier()
assert kolo.join() == 0
kolo.shutdown()
print("numpy alone: ok")
'''


TORCH = r'''
import torch
import kolo.torch as hvd

hvd.init()
assert (hvd.rank(), hvd.size()) == (0, 1)
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
OPS = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]


def values(dt, n):
    x = torch.arange(n) % 13
    return (x if dt == torch.uint8 else x - 6).to(dt)


def scaled(x, pre, post):
    if x.dtype.is_floating_point:
        return (x.double() * pre * post).to(x.dtype)
    return torch.trunc(torch.trunc(x.double() * pre) * post).to(x.dtype)


for dt in DTYPES:
    for n in (0, 1, 7, 4099):
        x = values(dt, n)
        for op in OPS:
            for pre, post in ((1.0, 1.0), (3.0, 0.5)):
                got = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
                assert got.dtype == dt and torch.equal(got, scaled(x, pre, post)), (dt, n, op)
        y = x.clone()
        hvd.allreduce_(y, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
        assert torch.equal(y, scaled(x, 3.0, 0.5))
        rows = x.reshape(-1, 1)
        assert torch.equal(hvd.allgather(rows), rows)
        assert torch.equal(hvd.broadcast(x, 0), x)
        z = x.clone()
        hvd.broadcast_(z, 0)
        assert torch.equal(z, x)
        assert torch.equal(hvd.alltoall(rows), rows)
        out, recv = hvd.alltoall(rows, splits=torch.tensor([n // 2], dtype=torch.int32))
        assert torch.equal(out, rows[:n // 2]) and recv.tolist() == [n // 2]
        got = hvd.reducescatter(rows, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
        assert torch.equal(got, scaled(rows, 3.0, 0.5))

# grouped forms
ts = [torch.arange(6.0).reshape(2, 3), torch.arange(4, dtype=torch.int32)]
assert all(torch.equal(a, b) for a, b in zip(hvd.grouped_allreduce(ts, op=hvd.Sum), ts))
assert all(torch.equal(a, b) for a, b in zip(hvd.grouped_allgather(ts), ts))
assert all(torch.equal(a, b) for a, b in zip(hvd.grouped_reducescatter(ts, op=hvd.Sum), ts))
us = [t.clone() for t in ts]
hvd.grouped_allreduce_(us, op=hvd.Average)
assert all(torch.equal(a, b) for a, b in zip(us, ts))

# gradients through the collectives, as Horovod's with one rank
w = torch.arange(6.0, requires_grad=True)
(hvd.allreduce(w, op=hvd.Sum) * 2).sum().backward()
assert torch.equal(w.grad, torch.full((6,), 2.0)), w.grad
w.grad = None
hvd.allgather(w.reshape(3, 2)).pow(2).sum().backward()
assert torch.equal(w.grad, 2 * w.detach()), w.grad
w.grad = None
hvd.broadcast(w, 0).sum().backward()
assert torch.equal(w.grad, torch.ones(6)), w.grad
w.grad = None
hvd.reducescatter(w.reshape(3, 2), op=hvd.Sum).sum().backward()
assert torch.equal(w.grad, torch.ones(6)), w.grad
w.grad = None
out, _ = hvd.alltoall(w.reshape(3, 2), splits=torch.tensor([3], dtype=torch.int32))
(out * 3).sum().backward()
assert torch.equal(w.grad, torch.full((6,), 3.0)), w.grad
w.grad = None
sum(o.sum() for o in hvd.grouped_allreduce([w, w * 2], op=hvd.Average)).backward()
assert torch.equal(w.grad, torch.full((6,), 3.0)), w.grad

# sparse, async handles, a training step
s = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
assert torch.equal(hvd.sparse_allreduce_async(s, "sp", hvd.Average)().to_dense(), s.to_dense())
h = hvd.allreduce_async(torch.ones(3), name="polled")
while not hvd.poll(h):
    pass
assert torch.equal(hvd.synchronize(h), torch.ones(3))
model = torch.nn.Linear(4, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
for _ in range(3):
    opt.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    opt.step()
hvd.barrier()
assert hvd.join() == 0
assert hvd.join(device=0) == 0  # alone: no zeros to put on a GPU

# init -> shutdown -> init, names reused
for _ in range(3):
    hvd.shutdown()
    hvd.init()
    assert torch.equal(hvd.allreduce(torch.ones(2), name="again"), torch.ones(2))
print("torch alone: ok")
'''


COORDINATOR_ONLY = r'''
import torch
import kolo.torch as hvd
from kolo import _snapshot

hvd.init()
assert hvd._kolo._eng().solo()
try:
    hvd.start_timeline("timeline.json")
except ValueError as e:
    assert "kolo run" in str(e), e
else:
    raise SystemExit("a timeline without a coordinator")
hvd.report_epoch(0, samples=4, metrics={"loss": 0.5})
assert not _snapshot.available()
state = hvd.elastic.TorchState(model=torch.nn.Linear(2, 1), epoch=0)
state.epoch = 1
state.commit()
state.check_host_updates()
print("coordinator calls alone: ok")
'''


@pytest.mark.parametrize("script", [NUMPY, TORCH, COORDINATOR_ONLY],
                         ids=["numpy", "torch_and_gradients", "what_needs_a_coordinator"])
def test_script_alone(tmp_path, script):
    p = _alone(tmp_path, script)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("alone: ok"), p.stdout


SIZE = r'''
import kolo
try:
    kolo.init()
except ValueError as e:
    print("refused:", e)
else:
    print("joined: %d of %d" % (kolo.rank(), kolo.size()))
'''


@pytest.mark.parametrize("env,want", [
    ({"KOLO_SIZE": "2"}, "refused: kolo: this process was not started by kolo (KOLO_COORDINATOR "
                         "is not set) but a size of 2 was asked for; launch it with `kolo run "
                         "-np 2 ...`"),
    ({"HOROVOD_SIZE": "3"}, "refused: kolo: this process was not started by kolo "
                            "(KOLO_COORDINATOR is not set) but a size of 3 was asked for; "
                            "launch it with `kolo run -np 3 ...`"),
    ({"KOLO_SIZE": "1"}, "joined: 0 of 1"),
    ({"KOLO_COORDINATOR": ""}, "joined: 0 of 1"),
])
def test_size_without_a_coordinator(tmp_path, env, want):
    p = _alone(tmp_path, SIZE, env)
    assert p.returncode == 0 and want in p.stdout, p.stdout


ALONE_MODULES = ["test_autograd.py", "test_sparse.py", "test_sync_batch_norm.py"]


def test_horovod_style_modules_alone(tmp_path):
    """The Horovod-style modules that mean something with one rank (process
    sets and Adasum need several; the lifecycle runs alone in
    test_horovod_style.py), one after the other in one process (one torch
    import), as test_horovod_style_ops.py runs them in a job."""
    p = _run_alone(tmp_path, [HOROVOD_SUITE] + ALONE_MODULES)
    assert p.returncode == 0 and "SUITE rank 0: ran" in p.stdout, p.stdout
    assert "failures 0, errors 0" in p.stdout, p.stdout
    # every module's tests ran, not only the first module's
    for module in ALONE_MODULES:
        assert "(%s." % module[:-3] in p.stdout, (module, p.stdout)


MODULE_NAMES = r'''
import warnings
import torch
import kolo.torch as hvd
# Horovod's own modules take the basics from mpi_ops (functions.py,
# elastic/sampler.py: `from horovod.torch.mpi_ops import rank, size`)
from kolo.torch.mpi_ops import (init, shutdown, is_initialized, rank, size, local_rank,
                                local_size, cross_rank, cross_size, is_homogeneous,
                                start_timeline, stop_timeline, mpi_built, mpi_enabled,
                                mpi_threads_supported, gloo_built, gloo_enabled, nccl_built,
                                cuda_built, rocm_built, ddl_built, ccl_built,
                                handle_average_backwards_compatibility as avg_compat)
init()
assert is_initialized() and (rank(), size(), local_rank(), local_size()) == (0, 1, 0, 1)
assert (cross_rank(), cross_size(), is_homogeneous()) == (0, 1, True)
for f in (mpi_built, mpi_enabled, mpi_threads_supported, gloo_built, gloo_enabled, rocm_built,
          ddl_built, ccl_built, hvd.sycl_built, hvd.mlsl_built):
    assert f() is False, f
assert isinstance(nccl_built(), int) and isinstance(cuda_built(), bool)
assert (nccl_built() > 0) == cuda_built()
assert hvd.nccl_built is nccl_built and hvd.start_timeline is start_timeline
assert avg_compat(None, None) == hvd.Average
assert avg_compat(hvd.Max, None) == hvd.Max and avg_compat(hvd.Adasum, None) == hvd.Adasum
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    assert avg_compat(None, True) == hvd.Average and avg_compat(None, False) == hvd.Sum
    assert any(issubclass(x.category, DeprecationWarning) for x in w), w
try:
    avg_compat(hvd.Sum, True)
    raise AssertionError("op and average together must fail")
except ValueError as e:
    assert "supersedes" in str(e), e
shutdown()
assert not is_initialized()
print("NAMES OK")
'''


def test_horovods_module_level_names(tmp_path):
    """What Horovod's horovod.torch.mpi_ops defines at module level (the
    basics, the build information, handle_average_backwards_compatibility)
    is in kolo.torch.mpi_ops too, and the same objects as kolo.torch's."""
    p = _alone(tmp_path, MODULE_NAMES)
    assert p.returncode == 0 and "NAMES OK" in p.stdout, p.stdout


ELASTIC_STATE = r'''
import random
import torch
import kolo.torch as hvd
# Horovod's module layout: horovod.torch.elastic.{sampler,state}
from kolo.torch.elastic.sampler import ElasticSampler
from kolo.torch.elastic.state import (TorchState, StateHandler, LRSchedulerStateHandler,
                                      get_handler_registry, set_handler_registry)
hvd.init()
assert hvd.elastic.TorchState is TorchState and hvd.elastic.ElasticSampler is ElasticSampler
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=1.0)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
sampler = ElasticSampler(list(range(20)), shuffle=True, seed=3)
hist = [1]
state = TorchState(model=model, optimizer=opt, lr_scheduler=sched, train_sampler=sampler,
                   epoch=0, history=hist)
# kept, not copied: the scheduler by its handler, a plain attribute as Horovod's ObjectState
assert state.lr_scheduler is sched and state.history is hist
assert isinstance(state._handlers["lr_scheduler"], LRSchedulerStateHandler)
state.commit()
opt.step(); sched.step(); sched.step()
state.epoch = 5
state.restore()
assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == 1.0, (sched.last_epoch, opt.param_groups)
assert state.epoch == 0
# a new model for a handled attribute is the handler's from now on, saved at once
m2 = torch.nn.Linear(2, 1)
state.model = m2
assert state._handlers["model"].value is m2
with torch.no_grad():
    m2.weight.fill_(7.0)
state.restore()
assert m2.weight.flatten().tolist() != [7.0, 7.0]
# Horovod's sample order: Python's shuffle seeded with seed + epoch
order = list(range(20)); random.Random(3).shuffle(order)
assert list(iter(sampler)) == order and sampler.indices == order
sampler.set_epoch(1)
order = list(range(20)); random.Random(4).shuffle(order)
assert list(iter(sampler)) == order
# a handler of one's own, through the registry
class Box:
    def __init__(self): self.v = 1
class BoxHandler(StateHandler):
    def save(self): self.kept = self.value.v
    def restore(self): self.value.v = self.kept
    def sync(self): pass
saved = list(get_handler_registry())
set_handler_registry(saved + [(Box, BoxHandler)])
box = Box()
s2 = TorchState(box=box)
s2.commit(); box.v = 9; s2.restore()
assert box.v == 1 and s2.box is box
set_handler_registry(saved)
print("ELASTIC OK")
hvd.shutdown()
'''


def test_elastic_state_as_horovods(tmp_path):
    """TorchState as horovod.torch.elastic.state's: a learning-rate
    scheduler is kept and rolled back with the commit, a new model for a
    handled attribute becomes the handler's, plain attributes are kept by
    reference, custom handlers register; ElasticSampler's order is
    Horovod's; the sampler and state submodules exist."""
    p = _alone(tmp_path, ELASTIC_STATE)
    assert p.returncode == 0 and "ELASTIC OK" in p.stdout, p.stdout


GROUPED_TYPES = r'''
import torch
import kolo.torch as hvd
hvd.init()
t = [torch.ones(2), torch.ones(3)]
# Horovod: the synchronous grouped forms give a list, a grouped handle's
# synchronize() (and grouped_allreduce_) the tuple its _handle_map holds
for f in (hvd.grouped_allreduce, hvd.grouped_allgather, hvd.grouped_reducescatter):
    assert type(f(t)) is list, f
for f in (hvd.grouped_allreduce_async, hvd.grouped_allreduce_async_,
          hvd.grouped_allgather_async, hvd.grouped_reducescatter_async):
    assert type(hvd.synchronize(f([torch.ones(2), torch.ones(3)]))) is tuple, f
assert type(hvd.grouped_allreduce_([torch.ones(2)])) is tuple
try:
    hvd.broadcast(torch.ones(1), root_rank=5)
except ValueError:
    pass
try:
    hvd.grouped_allreduce([])
    raise AssertionError("an empty group must fail")
except ValueError as e:  # its own reason, not the broadcast's before it
    assert "root" not in str(e) and "no request" in str(e), e
print("GROUPED OK")
'''


def test_grouped_result_types(tmp_path):
    p = _alone(tmp_path, GROUPED_TYPES)
    assert p.returncode == 0 and "GROUPED OK" in p.stdout, p.stdout
