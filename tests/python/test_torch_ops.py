"""kolo.torch collectives in real multi-process jobs, checked against
references computed in the test: every op x dtype x in-place/out-of-place x
sync/async, uneven allgather/alltoall/reducescatter, groups, scaling,
join, barrier and autograd."""
import pytest

WORKER = r'''
import sys
import numpy as np
import torch
import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
fails = []
checks = [0]


def check(cond, what):
    checks[0] += 1
    if not cond:
        fails.append(what)


DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(0,), (1,), (7,), (4099,), (3, 5)]


def data(shape, dt, k):
    count = int(np.prod(shape))
    return ((torch.arange(count, dtype=torch.int64) % 3) + (k % 2) + 1).reshape(shape).to(dt)


def close(a, b, dt):
    if dt in (torch.float16, torch.bfloat16):
        return torch.allclose(a.double(), b.double(), rtol=2e-2, atol=1e-2)
    if dt.is_floating_point:
        return torch.allclose(a.double(), b.double(), rtol=1e-6)
    return torch.equal(a.long(), b.long())


def reference(shape, dt, op, pre=1.0, post=1.0):
    xs = torch.stack([data(shape, dt, k).double() * pre for k in range(n)])
    if op == hvd.Sum:
        v = xs.sum(0)
    elif op == hvd.Average:
        v = xs.sum(0) / n
    elif op == hvd.Min:
        v = xs.min(0).values
    elif op == hvd.Max:
        v = xs.max(0).values
    else:
        v = xs.prod(0)
    v = v * post
    return v if dt.is_floating_point else torch.trunc(v)


OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
for dt in DTYPES:
    for shape in SHAPES:
        for op in OPS:
            want = reference(shape, dt, op)
            tag = "%s %s op%d" % (dt, shape, op)
            x = data(shape, dt, r)
            got = hvd.allreduce(x, op=op, name="ar.%s" % tag)
            check(close(got, want, dt) and got.dtype == dt and got.shape == x.shape,
                  "allreduce " + tag)
            check(torch.equal(x, data(shape, dt, r)), "allreduce changed its input " + tag)
            y = data(shape, dt, r)
            hvd.allreduce_(y, op=op, name="ar_.%s" % tag)
            check(close(y, want, dt), "allreduce_ " + tag)
            h = hvd.allreduce_async(data(shape, dt, r), op=op, name="ara.%s" % tag)
            check(close(hvd.synchronize(h), want, dt), "allreduce_async " + tag)
            z = data(shape, dt, r)
            h = hvd.allreduce_async_(z, op=op, name="ara_.%s" % tag)
            out = hvd.synchronize(h)
            check(close(z, want, dt) and out is z, "allreduce_async_ " + tag)

    # allgather with uneven first dimensions (rank k has k+1 rows; rank 0 of
    # 3 has none when k % 3 == 0 is skipped: exercise zero rows too)
    rows = [0 if (k == 1 and n > 2) else k + 1 for k in range(n)]
    mine = torch.full((rows[r], 3), r + 1).to(dt)
    g = hvd.allgather(mine, name="ag.%s" % dt)
    want = torch.cat([torch.full((rows[k], 3), k + 1).to(dt) for k in range(n)])
    check(g.dtype == dt and torch.equal(g, want), "allgather %s" % dt)
    g2 = hvd.synchronize(hvd.allgather_async(mine, name="aga.%s" % dt))
    check(torch.equal(g2, want), "allgather_async %s" % dt)

    # broadcast from every root, out of place and in place
    for root in range(n):
        b = hvd.broadcast(torch.full((5,), r + 1).to(dt), root, name="bc.%s.%d" % (dt, root))
        check(torch.equal(b, torch.full((5,), root + 1).to(dt)), "broadcast %s root %d" % (dt, root))
        t = torch.full((2, 2), r + 1).to(dt)
        hvd.broadcast_(t, root, name="bc_.%s.%d" % (dt, root))
        check(torch.equal(t, torch.full((2, 2), root + 1).to(dt)), "broadcast_ %s" % dt)
        t = torch.full((3,), r + 1).to(dt)
        hvd.synchronize(hvd.broadcast_async_(t, root, name="bca_.%s.%d" % (dt, root)))
        check(torch.equal(t, torch.full((3,), root + 1).to(dt)), "broadcast_async_ %s" % dt)

    # alltoall: rank r sends k+1 rows of value 100*r+k to rank k
    splits = [k + 1 for k in range(n)]
    send = torch.cat([torch.full((k + 1, 2), 10 * r + k) for k in range(n)]).to(dt)
    out, rs = hvd.alltoall(send, splits=splits, name="a2a.%s" % dt)
    want = torch.cat([torch.full((r + 1, 2), 10 * k + r) for k in range(n)]).to(dt)
    check(torch.equal(out, want) and rs.tolist() == [r + 1] * n, "alltoall %s" % dt)
    even = torch.arange(2 * n).to(dt)
    out = hvd.alltoall(even, name="a2ae.%s" % dt)
    want = torch.cat([torch.arange(2 * n)[2 * r:2 * r + 2] for _ in range(n)]).to(dt)
    check(torch.equal(out, want), "alltoall even %s" % dt)

    # reducescatter: 5 rows over n ranks (uneven)
    if dt in (torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.arange(10).reshape(5, 2).to(dt) + r
        full = sum(torch.arange(10).reshape(5, 2).double() + k for k in range(n))
        counts = [5 // n + (1 if k < 5 % n else 0) for k in range(n)]
        lo = sum(counts[:r])
        part = full[lo:lo + counts[r]]
        got = hvd.reducescatter(x, op=hvd.Sum, name="rs.%s" % dt)
        check(close(got, part, dt), "reducescatter sum %s" % dt)
        got = hvd.reducescatter(x, name="rsa.%s" % dt)
        check(close(got, part / n if dt.is_floating_point else torch.trunc(part / n), dt),
              "reducescatter average %s" % dt)

# prescale and postscale
x = torch.ones(10) * (r + 1)
got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
check(torch.allclose(got, torch.ones(10) * 1.5 * n * (n + 1) / 2), "pre/postscale")
got = hvd.allreduce(torch.ones(4), average=False)
check(torch.allclose(got, torch.ones(4) * n), "average=False is Sum")

# grouped allreduce, allgather, reducescatter
ts = [torch.ones(k + 1) * (r + 1) for k in range(5)]
outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grp")
check(all(torch.allclose(o, torch.ones(k + 1) * n * (n + 1) / 2) for k, o in enumerate(outs)),
      "grouped_allreduce")
hvd.grouped_allreduce_(ts, op=hvd.Max)
check(all(torch.allclose(t, torch.ones(k + 1) * n) for k, t in enumerate(ts)), "grouped_allreduce_")
gs = hvd.grouped_allgather([torch.ones(1, 2) * r, torch.ones(2) * r])
check(gs[0].shape == (n, 2) and gs[1].shape == (2 * n,), "grouped_allgather")
rs = hvd.grouped_reducescatter([torch.ones(n, 2), torch.ones(2 * n)], op=hvd.Sum)
check(torch.allclose(rs[0], torch.ones(1, 2) * n) and torch.allclose(rs[1], torch.ones(2) * n),
      "grouped_reducescatter")

# poll and synchronize
h = hvd.allreduce_async(torch.ones(3), name="polled")
while not hvd.poll(h):
    pass
check(torch.allclose(hvd.synchronize(h), torch.ones(3)), "poll then synchronize")
check(hvd.synchronize(123456789) is None, "unknown handle gives None")

# join: rank k runs k+1 steps, then joins; joined ranks contribute zeros
for step in range(n):
    if step <= r:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="join.step.%d" % step)
        check(torch.allclose(got, torch.ones(3) * (n - step)), "join step %d" % step)
last = hvd.join()
check(last == n - 1, "join returned %r" % last)
hvd.barrier()
# join(device) on a host without a GPU: the device only says where the
# zeros would live (Horovod built for CPU goes on); then everything works
if not torch.cuda.is_available():
    for step in range(n):
        if step <= r:
            got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="join.dev.%d" % step)
            check(torch.allclose(got, torch.ones(2) * (n - step)), "join(device) step %d" % step)
    check(hvd.join(hvd.local_rank()) == n - 1, "join(local_rank) on a CPU host")
    hvd.barrier()

# autograd
w = torch.ones(4, requires_grad=True)
hvd.allreduce(w * (r + 1), op=hvd.Sum).sum().backward()
check(torch.allclose(w.grad, torch.ones(4) * n * (r + 1)), "allreduce grad %s" % w.grad)
w = torch.ones(r + 1, 2, requires_grad=True)
g = hvd.allgather(w)
(g * torch.arange(g.shape[0]).reshape(-1, 1)).sum().backward()
lo = r * (r + 1) // 2
check(torch.allclose(w.grad, torch.arange(lo, lo + r + 1).reshape(-1, 1).float().expand(r + 1, 2)),
      "allgather grad %s" % w.grad)
w = torch.ones(3, requires_grad=True)
(hvd.broadcast(w, 0) * 2).sum().backward()
check(torch.allclose(w.grad, torch.ones(3) * (2 if r == 0 else 0)), "broadcast grad %s" % w.grad)
w = torch.ones(2 * n, requires_grad=True)
out = hvd.alltoall(w * (r + 1))
(out * 3).sum().backward()
check(torch.allclose(w.grad, torch.ones(2 * n) * 3 * (r + 1)), "alltoall grad %s" % w.grad)
w = torch.ones(n, 2, requires_grad=True)
out = hvd.reducescatter(w, op=hvd.Sum)
(out * (r + 1)).sum().backward()
# Horovod's gradient: for Sum the incoming gradient times the size, allgathered
want = torch.cat([torch.ones(1, 2) * (k + 1) for k in range(n)]) * n
check(torch.allclose(w.grad, want), "reducescatter grad %s" % w.grad)

for f in fails:
    print("FAIL", f)
print("checked %d, %d failures" % (checks[0], len(fails)))
print("checked, %d failures" % len(fails))
hvd.shutdown()
sys.exit(1 if fails else 0)
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_every_op(run_job, np_):
    job = run_job(np_, WORKER, timeout=240)
    assert job.rc == 0, job
    for k in range(np_):
        assert "checked, 0 failures" in job.lines(k), job


def test_one_rank_under_kolo_run(run_job):
    job = run_job(1, WORKER, timeout=240)
    assert job.rc == 0, job


def test_standalone_without_kolo_run(tmp_path):
    """Started alone, a script runs as rank 0 of 1, as under Horovod."""
    import os
    import subprocess
    import sys
    from conftest import PYDIR
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=PYDIR)
    for k in list(env):
        if k.startswith(("KOLO_COORDINATOR", "KOLO_RANK", "KOLO_SIZE", "HOROVOD_")):
            del env[k]
    p = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=240, universal_newlines=True)
    assert p.returncode == 0, p.stdout
    assert "checked, 0 failures" in p.stdout
