"""kolo.torch on CUDA tensors in real jobs, checked against the same
operation on CPU tensors (kolo's CPU backend as the reference): every op
x dtype, scaling, groups, uneven shapes, DistributedOptimizer, and the
CPU/GPU mismatch error. One rank uses NCCL; two ranks on one GPU use the
staged backend (NCCL refuses two ranks on one GPU); a process started
without `kolo run` computes alone, on the GPU."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYDIR = os.path.join(ROOT, "python")
KOLO = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")

WORKER = r'''
import sys
import torch
import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())
fails, checks = [], [0]


def check(cond, what):
    checks[0] += 1
    if not cond:
        fails.append(what)


def same(g, c, dt, what):
    g = g.cpu()
    if dt in (torch.float16, torch.bfloat16):
        ok = torch.allclose(g.double(), c.double(), rtol=3e-2, atol=3e-2)
    elif dt.is_floating_point:
        ok = torch.allclose(g.double(), c.double(), rtol=1e-5, atol=1e-6)
    else:
        ok = torch.equal(g, c)
    check(ok and g.shape == c.shape, "%s %s: gpu %s cpu %s" % (what, dt, g.flatten()[:6],
                                                              c.flatten()[:6]))


DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def data(shape, dt, salt=0):
    count = 1
    for d in shape:
        count *= d
    v = (torch.arange(count, dtype=torch.int64) * 7 + r * 3 + salt) % 11
    if dt != torch.uint8:
        v = v - 3
    v = v.reshape(shape)
    return (v.double() + 0.5).to(dt) if dt.is_floating_point else v.to(dt)


for dt in DTYPES:
    fl = dt.is_floating_point
    for op in OPS:
        for shape in [(0,), (1,), (7,), (4099,), (3, 5)]:
            x = data(shape, dt)
            tag = "allreduce %s %s" % (op, shape)
            same(hvd.allreduce(x.to(dev), op=op, name="g" + tag),
                 hvd.allreduce(x, op=op, name="c" + tag), dt, tag)
    x = data((4099,), dt)
    pre, post = (0.5, 3.0) if fl else (1.0, 2.0)
    same(hvd.allreduce(x.to(dev), op=hvd.Average, prescale_factor=pre, postscale_factor=post,
                       name="gs"),
         hvd.allreduce(x, op=hvd.Average, prescale_factor=pre, postscale_factor=post, name="cs"),
         dt, "scaled average")
    g = x.to(dev)
    hvd.allreduce_(g, op=hvd.Sum, name="gi")
    same(g, hvd.allreduce(x, op=hvd.Sum, name="ci"), dt, "in place")
    h = hvd.allreduce_async(x.to(dev), op=hvd.Max, name="ga")
    same(hvd.synchronize(h), hvd.allreduce(x, op=hvd.Max, name="ca"), dt, "async")
    xs = [data((k * 5 + 1,), dt, k) for k in range(4)]
    gs = hvd.grouped_allreduce([t.to(dev) for t in xs], op=hvd.Sum, name="gg")
    cs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="cg")
    for a, b in zip(gs, cs):
        same(a, b, dt, "grouped")
    rows = data((r + 1, 3), dt)
    same(hvd.allgather(rows.to(dev), name="gag"), hvd.allgather(rows, name="cag"), dt,
         "allgather")
    b = data((33,), dt, 5)
    same(hvd.broadcast(b.to(dev), root_rank=n - 1, name="gb"),
         hvd.broadcast(b, root_rank=n - 1, name="cb"), dt, "broadcast")
    splits = [(r + d) % 3 for d in range(n)]
    a2a = data((sum(splits), 2), dt, 6)
    go, gsp = hvd.alltoall(a2a.to(dev), splits=splits, name="ga2a")
    co, csp = hvd.alltoall(a2a, splits=splits, name="ca2a")
    same(go, co, dt, "alltoall")
    check(torch.equal(gsp.cpu(), csp), "alltoall splits")
    rs = data((7, 3), dt, 7)
    for op in (hvd.Sum, hvd.Average):
        same(hvd.reducescatter(rs.to(dev), op=op, name="grs%d" % op),
             hvd.reducescatter(rs, op=op, name="crs%d" % op), dt, "reducescatter %s" % op)

# DistributedOptimizer on the GPU against the same model on the CPU
torch.manual_seed(0)
cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
gpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(dev)
gpu_model.load_state_dict(cpu_model.state_dict())
opts = []
for tag, m in (("cpu", cpu_model), ("gpu", gpu_model)):
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    o = hvd.DistributedOptimizer(o, named_parameters=[(tag + "." + k, p)
                                                      for k, p in m.named_parameters()])
    opts.append(o)
hvd.broadcast_parameters(gpu_model.state_dict(), root_rank=0)
for step in range(5):
    torch.manual_seed(100 + step * n + r)
    xb, yb = torch.randn(8, 16), torch.randn(8, 4)
    for (m, o), d in zip(zip((cpu_model, gpu_model), opts), ("cpu", dev)):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(xb.to(d)), yb.to(d))
        loss.backward()
        o.step()
for (k, a), (_, b) in zip(cpu_model.state_dict().items(), gpu_model.state_dict().items()):
    check(torch.allclose(a, b.cpu(), rtol=1e-4, atol=1e-5), "optimizer " + k)

# CPU on one rank and GPU on another: Horovod's mismatch error everywhere
if n > 1:
    t = torch.ones(3, device=dev) if r == 0 else torch.ones(3)
    try:
        hvd.allreduce(t, name="mixed")
        check(False, "mixed devices ran")
    except hvd.HorovodInternalError as e:
        check("CPU/GPU device selection" in str(e), "mismatch text: %s" % e)

print("rank %d: %d checks, %d failures, nccl_built %d" % (r, checks[0], len(fails),
                                                          hvd.nccl_built()))
for f in fails[:20]:
    print("FAIL", f)
hvd.shutdown()
sys.exit(1 if fails else 0)
'''


def _run(cmd, tmp, env_extra=None, timeout=400):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR
    env["XDG_STATE_HOME"] = os.path.join(tmp, "state")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp,
                       timeout=timeout, universal_newlines=True)
    print(p.stdout)
    return p


def _worker():
    tmp = tempfile.mkdtemp(prefix="kolo-cuda-")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, "worker.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(WORKER))
    return tmp, path


@pytest.mark.parametrize("np", [1, 2])
def test_cuda_tensors_match_cpu(np):
    tmp, path = _worker()
    p = _run([KOLO, "run", "-np", str(np), "--", sys.executable, path], tmp,
             {"KOLO_LOG_LEVEL": "info"})
    assert p.returncode == 0, p.stdout
    assert "0 failures" in p.stdout


def test_cuda_tensors_without_kolo_run():
    # one process, no coordinator: every op computed locally on the GPU
    tmp, path = _worker()
    p = _run([sys.executable, path], tmp, {"KOLO_COORDINATOR": ""})
    assert p.returncode == 0, p.stdout
