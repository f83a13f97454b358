"""The framework-free `kolo` module on numpy arrays, in a 3-rank job."""

WORKER = r'''
import sys
import numpy as np
import kolo

kolo.init()
r, n = kolo.rank(), kolo.size()
ok = []
x = np.arange(6, dtype=np.float32) + r
ok.append(np.allclose(kolo.allreduce(x, op=kolo.Sum), n * np.arange(6) + n * (n - 1) / 2))
ok.append(np.allclose(kolo.allreduce(x), np.arange(6) + (n - 1) / 2))
m = kolo.allreduce(np.int64(5), op=kolo.Max)
ok.append(m.shape == () and m == 5)
outs = kolo.grouped_allreduce([np.ones(2) * r, np.ones(3, np.int32)], op=kolo.Sum, name="g")
ok.append(np.allclose(outs[0], n * (n - 1) / 2) and (outs[1] == n).all())
g = kolo.allgather(np.full((r + 1, 2), r, np.int16))
ok.append(g.shape == (n * (n + 1) // 2, 2) and g.dtype == np.int16 and g[-1, 0] == n - 1)
ok.append((kolo.broadcast(np.array([r, r], np.float64), root_rank=n - 1) == n - 1).all())
out, rs = kolo.alltoall(np.arange(n, dtype=np.int32) + 10 * r, splits=[1] * n)
ok.append(list(out) == [10 * k + r for k in range(n)] and list(rs) == [1] * n)
part = kolo.reducescatter(np.ones((5, 3), np.float32), op=kolo.Sum)
ok.append(part.shape == (5 // n + (1 if r < 5 % n else 0), 3) and (part == n).all())
h = kolo.allreduce_async(np.ones(4, np.float64), name="async")
ok.append(np.allclose(kolo.synchronize(h), 1.0))
try:
    kolo.allreduce(np.array(["a"]))
    ok.append(False)
except ValueError:
    ok.append(True)
kolo.barrier()
last = kolo.join()
ok.append(0 <= last < n and (kolo.allgather(np.array([last])) == last).all())
print("numpy checks", ok)
kolo.shutdown()
sys.exit(0 if all(ok) else 1)
'''


def test_numpy_collectives(run_job):
    job = run_job(3, WORKER)
    assert job.rc == 0, job
    assert len([line for line in job.out.splitlines() if "numpy checks" in line]) == 3, job
