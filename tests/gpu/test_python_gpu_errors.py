"""The Python side of a GPU request where it cannot run: a clear error, no
crash. Debian's torch has no CUDA, so the request is built at the engine
level (a device ordinal and an address), as kolo.torch builds it for a
CUDA tensor. Also: nccl_built()/cuda_built() tell the truth about the
library."""
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYDIR = os.path.join(ROOT, "python")
KOLO = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")

WORKER = r'''
import ctypes
import sys
import torch
import kolo.torch as hvd
from kolo import _engine as E, _lib
from kolo.torch import mpi_ops

hvd.init()
lib = E._gpu_api(_lib.load())
why = ctypes.create_string_buffer(512)
gpus = lib.kolo_gpu_count(why, 512)
fails = []
if hvd.nccl_built() != lib.kolo_nccl_built() or hvd.cuda_built() != (lib.kolo_cuda_built() > 0):
    fails.append("nccl_built/cuda_built disagree with libkolo")
buf = torch.ones(4)
req = E.Req(E.ALLREDUCE, "gpu", buf.data_ptr(), buf.data_ptr(), E.FLOAT32, (4,), E.K_SUM,
            device=0)
try:
    hvd.synchronize(mpi_ops._submit([req], buf, lambda res: buf))
    fails.append("a GPU request with a host buffer ran")
except ValueError as e:
    text = str(e)
    print("error:", text)
    want = "host memory" if gpus else "GPU"
    if want not in text:
        fails.append("unclear error: " + text)
# the context still works for CPU tensors
out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")
if not torch.equal(out, torch.ones(3) * hvd.size()):
    fails.append("CPU allreduce after the GPU error: %s" % out)
print("gpus", gpus, why.value.decode(), "nccl_built", hvd.nccl_built())
for f in fails:
    print("FAIL", f)
hvd.shutdown()
sys.exit(1 if fails else 0)
'''


def test_gpu_request_without_gpu_is_a_clear_error(tmp_path):
    tmp = str(tmp_path)
    path = os.path.join(tmp, "worker.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(WORKER))
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR
    env["XDG_STATE_HOME"] = os.path.join(tmp, "state")
    p = subprocess.run([KOLO, "run", "-np", "2", "--", sys.executable, path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp,
                       timeout=120, universal_newlines=True)
    print(p.stdout)
    assert p.returncode == 0, p.stdout
    assert "error:" in p.stdout
