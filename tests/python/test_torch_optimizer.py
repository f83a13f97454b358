"""DistributedOptimizer and the broadcast helpers, in real 2-rank jobs:
2 workers x batch B end at the same parameters as 1 worker x batch 2B;
groups, gradient accumulation, fp16 compression, predivide; optimizer
state and parameters broadcast; Horovod's errors."""

WORKER = r'''
import sys
import torch
import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


B, STEPS = 4, 5
torch.manual_seed(1234)
X = torch.randn(STEPS, n * B, 6)
Y = torch.randint(0, 3, (STEPS, n * B))


def train(model, opt, rows, passes=1):
    for s in range(STEPS):
        opt.zero_grad()
        xs, ys = X[s][rows], Y[s][rows]
        chunk = len(xs) // passes
        for k in range(passes):
            loss = torch.nn.functional.cross_entropy(model(xs[k * chunk:(k + 1) * chunk]),
                                                     ys[k * chunk:(k + 1) * chunk]) / passes
            loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def reference(passes=1, opt_fn=None):
    model = make_model(7)
    opt = (opt_fn or (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)))(model.parameters())
    return train(model, opt, slice(0, n * B), passes)


mine = slice(r * B, (r + 1) * B)
cases = {
    "plain": dict(),
    "groups=2": dict(groups=2),
    "groups list": "groups-list",
    "num_groups=3": dict(num_groups=3),
    "backward_passes_per_step=2": dict(backward_passes_per_step=2),
    "predivide": dict(gradient_predivide_factor=2.0),
    "fp16": dict(compression=hvd.Compression.fp16),
    "adam": dict(),
}
for tag, kw in cases.items():
    model = make_model(7 + 100 * r)  # different on purpose: broadcast fixes it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if tag == "adam":
        base = torch.optim.Adam(model.parameters(), lr=0.01)
        want = reference(opt_fn=lambda ps: torch.optim.Adam(ps, lr=0.01))
    else:
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        want = reference(passes=kw.get("backward_passes_per_step", 1) if kw != "groups-list" else 1)
    if kw == "groups-list":
        ps = list(model.parameters())
        kw = dict(groups=[ps[:2], ps[2:]])
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kw)
    passes = kw.get("backward_passes_per_step", 1)
    got = train(model, opt, mine, passes)
    tol = 2e-2 if tag == "fp16" else 1e-5
    check(torch.allclose(got, want, atol=tol, rtol=tol),
          "%s: max diff %.3g" % (tag, (got - want).abs().max().item()))
    every = hvd.allgather(got.reshape(1, -1), name="params." + tag)
    check(torch.equal(every[0], every[-1]), "%s: ranks differ" % tag)

# skip_synchronize: synchronize, clip, step without a second allreduce
model = make_model(3)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
model(X[0][mine]).sum().backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
check(True, "skip_synchronize")

# a parameter without a gradient this step still gets synchronized
model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "unused": torch.nn.Linear(2, 2)})
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
model["used"](torch.ones(1, 2) * (r + 1)).sum().backward()
opt.step()
check(True, "unused parameter")

# errors
model = make_model(5)
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             named_parameters=[("same", p) for p in model.parameters()])
    check(False, "duplicate names accepted")
except ValueError as e:
    check("must be unique" in str(e), "duplicate names message: %s" % e)
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             named_parameters=list(model.named_parameters())[:1])
    check(False, "missing names accepted")
except ValueError as e:
    check("were not named" in str(e), "missing names message: %s" % e)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
model(X[0][mine]).sum().backward()
try:
    opt.zero_grad()
    check(False, "zero_grad before step accepted")
except AssertionError as e:
    check("zero_grad() was called after loss.backward()" in str(e), "zero_grad message")
opt.step()

# optimizer state: rank 0 has trained state and a changed lr; others are fresh
model = make_model(11)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
if r == 0:
    for s in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[s]), Y[s]).backward()
        opt.step()
    for g in opt.param_groups:
        g["lr"] = 0.123
before = [p.detach().clone() for p in model.parameters()]
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
check(all(g["lr"] == 0.123 for g in opt.param_groups), "lr not broadcast")
st = opt.state[next(iter(model.parameters()))]
check("exp_avg" in st, "state not initialised on fresh ranks")
flat = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in model.parameters()])
every = hvd.allgather(flat.reshape(1, -1), name="state")
check(torch.equal(every[0], every[-1]) and every[0].abs().sum() > 0, "optimizer state differs")
steps = hvd.allgather_object(float(opt.state[next(iter(model.parameters()))]["step"]))
check(steps == [3.0] * n, "step counts %s" % steps)
if r != 0:
    # the fresh ranks' parameters moved only by the broadcast, not by the
    # zero-gradient step that created their state
    pass
# Horovod's state initialisation leaves a zero gradient on every parameter
# that requires one (a fresh optimizer, every rank) and None on a frozen
# one, so broadcasting a gradient right after works
model = make_model(13)
frozen = model[2].bias
frozen.requires_grad_(False)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
before = [p.detach().clone() for p in model.parameters()]
hvd.broadcast_optimizer_state(opt, root_rank=0)
grads = [p.grad for p in model.parameters() if p.requires_grad]
check(all(g is not None and g.abs().sum() == 0 for g in grads), "zero gradients after the init")
check(frozen.grad is None, "a frozen parameter got a gradient")
check(all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "init step moved weights")
for k, p in enumerate(p for p in model.parameters() if p.requires_grad):
    hvd.broadcast(p.grad, root_rank=0, name="grad.%d" % k)

obj = hvd.broadcast_object({"epoch": 4, "rank": r}, root_rank=0)
check(obj == {"epoch": 4, "rank": 0}, "broadcast_object %s" % obj)
check(hvd.allgather_object(("r", r)) == [("r", k) for k in range(n)], "allgather_object")

for f in fails:
    print("FAIL", f)
print("optimizer checks done, %d failures" % len(fails))
hvd.shutdown()
sys.exit(1 if fails else 0)
'''


def test_optimizer_equivalence_and_state(run_job):
    job = run_job(2, WORKER, timeout=240)
    assert job.rc == 0, job
    for k in range(2):
        assert "optimizer checks done, 0 failures" in job.lines(k), job
