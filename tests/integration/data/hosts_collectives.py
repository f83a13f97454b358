"""Every collective across hosts (tests/integration/test_hosts_netns.sh),
each result checked exactly against a reference computed here.

Default mode: allreduce (sum, average, min, max, product; every dtype;
0, 1, 7, 1000 and 300000 elements, fused and alone, in place), prescale
and postscale, grouped allreduce (mixed dtypes), allgather with a
different first dimension per rank (one rank with none), broadcast from
every root, alltoall with uneven splits (zeros included) and even,
reducescatter (sum and average, uneven rows), barrier (no rank leaves
before every rank entered), join, two process sets that span hosts, and
the job's topology against --layout (the local sizes of the hosts) and
the ranks' network namespaces. Values are small integers (halves for
floats) so every dtype holds every result exactly, bfloat16 included, and
averages are made to divide: a result is right or WRONG, no tolerance.
Prints one "WRONG ..." line per mismatch and exits 1 if there was any;
"checked N, F wrong" at the end.

--loop STEPS: training-like steps instead, on kolo's numpy API (fused allreduces of 1000 and
200000 floats and a small int64 one, every result checked, an allgather
and a barrier every 5 steps), "step N" per step; rank 0 writes its last
step to --progress FILE. For the fault sections: a failure raises.
"""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--layout", default="", help="the hosts' local sizes, e.g. 2,1,2")
p.add_argument("--loop", type=int, default=0)
p.add_argument("--pause", type=float, default=0.0)
p.add_argument("--progress", default="")
p.add_argument("--tag", default="", help="not used: marks the command line for the test")
a = p.parse_args()
T0 = time.time()
wrong = [0]
checks = [0]


def loop():
    """The training loop, on kolo's numpy API (no torch to import: the
    fault sections start in a second)."""
    import numpy as np
    import kolo
    kolo.init()
    r, n = kolo.rank(), kolo.size()
    for step in range(a.loop):
        small = np.full(1000, r + step % 7, dtype=np.float32)
        big = np.full(200000, r + 1, dtype=np.float32)
        ints = np.arange(5, dtype=np.int64) + r * step
        hs = [kolo.allreduce_async(small, op=kolo.Sum, name="loop.small"),
              kolo.allreduce_async(big, op=kolo.Sum, name="loop.big"),
              kolo.allreduce_async(ints, op=kolo.Sum, name="loop.ints")]
        outs = [kolo.synchronize(h) for h in hs]
        wants = [np.full(1000, n * (n - 1) // 2 + n * (step % 7), dtype=np.float32),
                 np.full(200000, n * (n + 1) // 2, dtype=np.float32),
                 np.arange(5, dtype=np.int64) * n + step * n * (n - 1) // 2]
        for what, got, want in zip(("small", "big", "ints"), outs, wants):
            if got.dtype != want.dtype or not np.array_equal(got, want):
                print("WRONG rank %d step %d loop %s: %r != %r" % (r, step, what, got[:3], want[:3]),
                      flush=True)
                sys.exit(1)
        if step % 5 == 4:
            g = kolo.allgather(np.full((r + 1, 2), r, dtype=np.int32), name="loop.gather")
            want = np.concatenate([np.full((k + 1, 2), k, dtype=np.int32) for k in range(n)])
            if not np.array_equal(g, want):
                print("WRONG rank %d step %d loop allgather" % (r, step), flush=True)
                sys.exit(1)
            kolo.barrier()
        print("step %d" % step, flush=True)
        if a.progress and r == 0:
            with open(a.progress + ".tmp", "w") as f:
                f.write("%d\n" % step)
            os.replace(a.progress + ".tmp", a.progress)
        if a.pause:
            time.sleep(a.pause)
    print("done %d" % a.loop, flush=True)
    kolo.shutdown()
    sys.exit(0)


if a.loop:
    loop()

import torch  # noqa: E402

import kolo.torch as hvd  # noqa: E402

N = int(os.environ.get("KOLO_SIZE", "1"))
SETS = [hvd.ProcessSet([0, N - 1])] if N > 1 else []
if N > 2:
    SETS.append(hvd.ProcessSet([k for k in range(N) if k % 2 == 1]))
hvd.init(process_sets=SETS)
r, n = hvd.rank(), hvd.size()


def check(ok, what):
    checks[0] += 1
    if not ok:
        wrong[0] += 1
        if wrong[0] <= 200:
            print("WRONG rank %d: %s" % (r, what), flush=True)


def same(got, want):
    """Exact: dtype, shape and every value."""
    return (isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(got, want))


def first_diff(got, want):
    if not isinstance(got, torch.Tensor):
        return "got %r" % (got,)
    if got.dtype != want.dtype or got.shape != want.shape:
        return "got %s %s, want %s %s" % (got.dtype, tuple(got.shape), want.dtype, tuple(want.shape))
    bad = (got.double() != want.double()).reshape(-1).nonzero()
    i = int(bad[0]) if len(bad) else -1
    return "%d of %d elements differ, first at %d: %r != %r" % (
        len(bad), want.numel(), i, got.reshape(-1)[i].item(), want.reshape(-1)[i].item())


def expect(got, want, what):
    ok = same(got, want)
    check(ok, what if ok else "%s: %s" % (what, first_diff(got, want)))


DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
SIZES = [0, 1, 7, 1000, 300000]
OPS = [(hvd.Sum, "sum"), (hvd.Average, "average"), (hvd.Min, "min"), (hvd.Max, "max"),
       (hvd.Product, "product")]
SCATTER_DTYPES = [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                  torch.float64]


def kind(dt):
    """What the data of a dtype depends on: no negatives in uint8, halves
    in the floats."""
    return "u8" if dt == torch.uint8 else "float" if dt.is_floating_point else "int"


_data = {}
_refs = {}


def data64(op, k_, count, k):
    """Rank k's input of an allreduce of op, as float64 (exact), for dtypes
    of kind k_; cached (the large ones cost more than the collectives)."""
    key = (op, k_, count, k)
    if key not in _data:
        i = torch.arange(count, dtype=torch.int64)
        if op in (hvd.Sum, hvd.Average):
            # sum over k = n * (i % 5 + n - 1 + offset): the average divides
            off = {"u8": 0.0, "int": -3.0, "float": -3.5}[k_]
            v = (i % 5 + 2 * k).double() + off
        elif op in (hvd.Min, hvd.Max):
            v = (i * 7 + k * 3) % 11
            v = (v if k_ == "u8" else v - 5).double()
        else:  # product: 1, 2 and (signed) -1; at most 2^5 in magnitude
            v = (i + k) % 3
            if k_ == "u8":
                v = v % 2 + 1
            else:
                v = torch.where(v == 2, torch.full_like(v, -1), v + 1)
            v = v.double()
        _data[key] = v
    return _data[key]


def data(op, dt, count, k):
    """A fresh tensor of dtype dt (the collectives may write into it)."""
    return data64(op, kind(dt), count, k).to(dt, copy=True)


def reference(op, dt, count):
    key = (op, kind(dt), count)
    if key not in _refs:
        xs = [data64(op, kind(dt), count, k) for k in range(n)]
        if op in (hvd.Sum, hvd.Average):
            v = sum(xs)
            if op == hvd.Average:
                v = v / n
                if kind(dt) != "float":
                    v = torch.trunc(v)
        elif op == hvd.Min:
            v = torch.stack(xs).min(0).values if count else xs[0]
        elif op == hvd.Max:
            v = torch.stack(xs).max(0).values if count else xs[0]
        else:
            v = xs[0]
            for x in xs[1:]:
                v = v * x
        _refs[key] = v
    return _refs[key].to(dt, copy=True)


def section(name):
    if r == 0:
        print("section %s at %.1f s (%d wrong so far)" % (name, time.time() - T0, wrong[0]), flush=True)


# ---------------------------------------------------------------- topology
section("topology")
me = torch.tensor([[r, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
                    int(os.environ.get("KOLO_HOST_ID", "f")[:15], 16),
                    os.stat("/proc/self/ns/net").st_ino]], dtype=torch.int64)
topo = hvd.allgather(me, name="topology")
check(topo.shape == (n, 7) and topo[:, 0].tolist() == list(range(n)), "topology rows %s" % topo)
hosts = {}
for row in topo.tolist():
    hosts.setdefault(row[5], []).append(row)
for hid, rows in hosts.items():
    check(sorted(x[1] for x in rows) == list(range(len(rows))),
          "host %d: local ranks %s" % (hid, [x[1] for x in rows]))
    check(all(x[2] == len(rows) for x in rows), "host %d: local sizes %s, %d ranks there"
          % (hid, [x[2] for x in rows], len(rows)))
    check(len({x[6] for x in rows}) == 1, "host %d: ranks in different network namespaces" % hid)
check(len({rows[0][6] for rows in hosts.values()}) == len(hosts),
      "two hosts share a network namespace: %s" % topo.tolist())
if a.layout:
    want = sorted(int(x) for x in a.layout.split(","))
    check(sorted(len(v) for v in hosts.values()) == want,
          "local sizes %s, want %s" % (sorted(len(v) for v in hosts.values()), want))
for lr in range(max(len(v) for v in hosts.values())):
    rows = [x for x in topo.tolist() if x[1] == lr]
    check(sorted(x[3] for x in rows) == list(range(len(rows))),
          "cross ranks of local rank %d: %s" % (lr, [x[3] for x in rows]))
if r == 0:
    print("hosts: %s encrypt=%s hier_lanes=%s" % (
        {h: [x[0] for x in v] for h, v in hosts.items()}, os.environ.get("KOLO_DATA_ENCRYPT", "0"),
        os.environ.get("KOLO_HIER_LANES", "default")), flush=True)

# ---------------------------------------------------------------- allreduce
section("allreduce")
for dt in DTYPES:
    for op, opname in OPS:
        # every size submitted at once (fused where they fit), then waited for
        ins = {c: data(op, dt, c, r) for c in SIZES}
        hs = {c: hvd.allreduce_async(ins[c], op=op, name="ar.%s.%s.%d" % (dt, opname, c))
              for c in SIZES}
        for c in SIZES:
            tag = "allreduce %s %s %d" % (opname, dt, c)
            expect(hvd.synchronize(hs[c]), reference(op, dt, c), tag)
            check(torch.equal(ins[c], data(op, dt, c, r)), tag + ": the input changed")
    # alone and in place
    for c in (7, 300000):
        x = data(hvd.Sum, dt, c, r)
        hvd.allreduce_(x, op=hvd.Sum, name="ar_.%s.%d" % (dt, c))
        expect(x, reference(hvd.Sum, dt, c), "allreduce_ sum %s %d" % (dt, c))
        got = hvd.allreduce(data(hvd.Max, dt, c, r), op=hvd.Max, name="ar1.%s.%d" % (dt, c))
        expect(got, reference(hvd.Max, dt, c), "allreduce max alone %s %d" % (dt, c))

# integer average truncates toward zero (sums that do not divide)
for dt in (torch.int8, torch.int16, torch.int32, torch.int64):
    for sign in (1, -1):
        x = torch.full((9,), sign * (r + 1), dtype=dt)
        got = hvd.allreduce(x, op=hvd.Average, name="trunc.%s.%d" % (dt, sign))
        want = torch.full((9,), int(sign * (n * (n + 1) // 2) / n), dtype=dt)
        expect(got, want, "integer average %s sign %d" % (dt, sign))

# prescale and postscale (powers of two: exact)
for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
    for c in (7, 300000):
        x = torch.full((c,), float(r + 1), dtype=dt)
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0,
                            name="scaled.%s.%d" % (dt, c))
        expect(got, torch.full((c,), 2.0 * n * (n + 1) / 2, dtype=dt), "pre/postscale %s %d" % (dt, c))
        got = hvd.allreduce(x * 2, op=hvd.Average, postscale_factor=0.5, name="avgscaled.%s.%d" % (dt, c))
        expect(got, torch.full((c,), (n + 1) / 2, dtype=dt), "average postscale %s %d" % (dt, c))

# ---------------------------------------------------------------- grouped
section("grouped allreduce")
for op, opname in OPS:
    spec = [(torch.float32, 7), (torch.float64, 1000), (torch.int32, 300000), (torch.bfloat16, 1),
            (torch.float16, 0), (torch.int64, 1000), (torch.float32, 300000)]
    ts = [data(op, dt, c, r) for dt, c in spec]
    outs = hvd.grouped_allreduce(ts, op=op, name="group.%s" % opname)
    check(len(outs) == len(spec), "grouped %s: %d outputs" % (opname, len(outs)))
    for (dt, c), o in zip(spec, outs):
        expect(o, reference(op, dt, c), "grouped allreduce %s %s %d" % (opname, dt, c))
ts = [data(hvd.Sum, torch.float32, c, r).to(torch.float32) for c in (3, 300000, 5)]
hvd.grouped_allreduce_(ts, op=hvd.Sum, name="group_")
for t, c in zip(ts, (3, 300000, 5)):
    expect(t, reference(hvd.Sum, torch.float32, c), "grouped allreduce_ %d" % c)

# ---------------------------------------------------------------- allgather
section("allgather")
ROWS = [3, 0, 5, 1, 2, 4, 6]


def rows_of(k, dt, cols=3):
    j = torch.arange(ROWS[k % len(ROWS)], dtype=torch.int64).reshape(-1, 1)
    return (10 * k + j + torch.arange(cols, dtype=torch.int64)).to(dt)


for dt in DTYPES:
    want = torch.cat([rows_of(k, dt) for k in range(n)])
    expect(hvd.allgather(rows_of(r, dt), name="ag.%s" % dt), want, "allgather %s" % dt)
    g = hvd.synchronize(hvd.allgather_async(rows_of(r, dt), name="aga.%s" % dt))
    expect(g, want, "allgather_async %s" % dt)
for dt in (torch.float32, torch.int64, torch.float64):
    def big(k):
        j = torch.arange(20000 * (k + 1), dtype=torch.int64).reshape(-1, 1)
        return (k * 1000 + j % 997 + torch.arange(5, dtype=torch.int64)).to(dt)
    expect(hvd.allgather(big(r), name="agbig.%s" % dt), torch.cat([big(k) for k in range(n)]),
           "allgather large %s" % dt)
gs = hvd.grouped_allgather([rows_of(r, torch.float32), rows_of(r, torch.int32, 1)], name="agg")
expect(gs[0], torch.cat([rows_of(k, torch.float32) for k in range(n)]), "grouped allgather 0")
expect(gs[1], torch.cat([rows_of(k, torch.int32, 1) for k in range(n)]), "grouped allgather 1")

# ---------------------------------------------------------------- broadcast
section("broadcast")
for dt in DTYPES:
    for root in range(n):
        x = data(hvd.Min, dt, 7, r)
        expect(hvd.broadcast(x, root, name="bc.%s.%d" % (dt, root)), data(hvd.Min, dt, 7, root),
               "broadcast %s root %d" % (dt, root))
        check(torch.equal(x, data(hvd.Min, dt, 7, r)), "broadcast changed its input")
        y = data(hvd.Min, dt, 1000, r).reshape(10, 100)
        hvd.broadcast_(y, root, name="bc_.%s.%d" % (dt, root))
        expect(y, data(hvd.Min, dt, 1000, root).reshape(10, 100),
               "broadcast_ %s root %d" % (dt, root))
for dt in (torch.float32, torch.int32, torch.bfloat16):
    for root in range(n):
        x = data(hvd.Min, dt, 300000, r)
        expect(hvd.broadcast(x, root, name="bcbig.%s.%d" % (dt, root)),
               data(hvd.Min, dt, 300000, root), "broadcast large %s root %d" % (dt, root))

# ---------------------------------------------------------------- alltoall
section("alltoall")


def a2a_rows(src, dst, dt, count):
    j = torch.arange(count, dtype=torch.int64).reshape(-1, 1)
    return ((src * n + dst) * 4 + j % 3 + torch.zeros(1, 2, dtype=torch.int64)).to(dt)


for dt in DTYPES:
    splits = [(r + 2 * k) % 3 for k in range(n)]  # zeros included, uneven
    send = torch.cat([a2a_rows(r, k, dt, splits[k]) for k in range(n)])
    out, recv = hvd.alltoall(send, splits=splits, name="a2a.%s" % dt)
    want = torch.cat([a2a_rows(k, r, dt, (k + 2 * r) % 3) for k in range(n)])
    expect(out, want, "alltoall %s" % dt)
    check(recv.tolist() == [(k + 2 * r) % 3 for k in range(n)],
          "alltoall %s: received splits %s" % (dt, recv.tolist()))
    even = (torch.arange(2 * n, dtype=torch.int64) + 10 * r).to(dt)
    out = hvd.alltoall(even, name="a2ae.%s" % dt)
    expect(out, torch.cat([torch.arange(2 * r, 2 * r + 2) + 10 * k for k in range(n)]).to(dt),
           "alltoall even %s" % dt)
for dt in (torch.float32, torch.int64):
    splits = [10000 * (1 + (r + k) % 3) for k in range(n)]

    def block(src, dst):
        cnt = 10000 * (1 + (src + dst) % 3)
        j = torch.arange(cnt, dtype=torch.int64).reshape(-1, 1)
        return (src * 100 + dst + (j % 50) * 1000 + torch.arange(8, dtype=torch.int64)).to(dt)
    out, recv = hvd.alltoall(torch.cat([block(r, k) for k in range(n)]), splits=splits,
                             name="a2abig.%s" % dt)
    expect(out, torch.cat([block(k, r) for k in range(n)]), "alltoall large %s" % dt)
    check(recv.tolist() == [10000 * (1 + (k + r) % 3) for k in range(n)], "alltoall large splits")

# ---------------------------------------------------------------- reducescatter
section("reducescatter")
for dt in SCATTER_DTYPES:
    for rows, cols in ((2 * n + 3, 3), (n - 1, 2), (100003, 3)):
        if rows == 100003 and dt not in (torch.float32, torch.int32):
            continue
        counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
        lo = sum(counts[:r])
        for op, opname in OPS[:2]:
            x = data(op, dt, rows * cols, r).reshape(rows, cols)
            full = reference(op, dt, rows * cols).reshape(rows, cols)
            got = hvd.reducescatter(x, op=op, name="rs.%s.%s.%d" % (dt, opname, rows))
            expect(got, full[lo:lo + counts[r]], "reducescatter %s %s %dx%d" % (opname, dt, rows, cols))

# ---------------------------------------------------------------- barrier
section("barrier")
for i in range(3):
    time.sleep(0.05 * ((r + i) % n))
    t_in = time.time()
    hvd.barrier()
    t_out = time.time()
    ins = hvd.allgather(torch.tensor([t_in], dtype=torch.float64), name="barrier.t.%d" % i)
    # one clock for every namespace: nobody leaves before the last one entered
    check(t_out >= float(ins.max()), "barrier %d: left at %.6f, rank %d entered at %.6f"
          % (i, t_out, int(ins.argmax()), float(ins.max())))

# ---------------------------------------------------------------- join
section("join")
for step in range(n):
    if step <= r:  # rank k runs k+1 steps, then joins; joined ranks add zeros
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="join.small.%d" % step)
        expect(got, torch.full((3,), float(n - step)), "join step %d small" % step)
        got = hvd.allreduce(torch.full((100000,), 2, dtype=torch.int64), op=hvd.Sum,
                            name="join.big.%d" % step)
        expect(got, torch.full((100000,), 2 * (n - step), dtype=torch.int64), "join step %d big" % step)
last = hvd.join()
check(last == n - 1, "join returned %r, want %d" % (last, n - 1))
hvd.barrier()

# ---------------------------------------------------------------- process sets
section("process sets")
for ps in SETS:
    if not ps.included():
        continue
    m = len(ps.ranks)
    tag = "set %s" % ps.ranks
    for c in (7, 300000):
        got = hvd.allreduce(torch.full((c,), float(r + 1)), op=hvd.Sum, name="ps.ar.%d" % c,
                            process_set=ps)
        expect(got, torch.full((c,), float(sum(q + 1 for q in ps.ranks))), "%s allreduce %d" % (tag, c))
    g = hvd.allgather(rows_of(r, torch.int32), name="ps.ag", process_set=ps)
    expect(g, torch.cat([rows_of(q, torch.int32) for q in ps.ranks]), tag + " allgather")
    root = ps.ranks[-1]
    b = hvd.broadcast(torch.full((1000,), r, dtype=torch.int64), root, name="ps.bc", process_set=ps)
    expect(b, torch.full((1000,), root, dtype=torch.int64), tag + " broadcast")
    out = hvd.alltoall(torch.full((m,), r, dtype=torch.int32), name="ps.a2a", process_set=ps)
    expect(out, torch.tensor(ps.ranks, dtype=torch.int32), tag + " alltoall")
    hvd.barrier(process_set=ps)
hvd.barrier()

# a last allreduce after everything: the plane still agrees
expect(hvd.allreduce(torch.full((5,), float(r)), op=hvd.Sum, name="final"),
       torch.full((5,), float(n * (n - 1) // 2)), "final allreduce")
print("checked %d, %d wrong, %.1f s" % (checks[0], wrong[0], time.time() - T0), flush=True)
hvd.shutdown()
sys.exit(1 if wrong[0] else 0)
