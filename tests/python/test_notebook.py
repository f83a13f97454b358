"""kolo.run from a real Jupyter kernel (issue 30, item 3): a notebook whose
cells define a training function and run it with kolo.run, as horovod.run
and Databricks' HorovodRunner are used from notebooks, executed cell by
cell by nbclient in an ipykernel (Debian's python3-nbclient and
python3-ipykernel; skipped, 77, without them). The function exists only
in the kernel's __main__ (a cell), so it must travel by value
(cloudpickle); its closure, a lambda, a worker's exception (raised in the
cell, with the worker's traceback) and the workers' streamed output are
checked in the cells' outputs."""
import os

import pytest

from conftest import KOLO, PYDIR

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("cloudpickle")

CELLS = [
    # 1: a function defined in a cell, closing over a cell's variable
    '''
import kolo
scale = 3.0

def train(offset):
    import torch
    import kolo.torch as hvd
    hvd.init()
    t = hvd.allreduce(torch.tensor([hvd.rank() + offset], dtype=torch.float64), op=hvd.Sum)
    print("trained on rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
    return hvd.rank(), t.item() * scale
''',
    # 2: run it on 2 workers; results in rank order
    '''
results = kolo.run(train, args=(10,), np=2)
print("RESULTS", results)
assert results == [(0, 63.0), (1, 63.0)], results
''',
    # 3: a lambda, and the same cell function again with other arguments
    '''
assert kolo.run(lambda: __import__("os").environ["KOLO_RANK"], np=2, stream=False) == ["0", "1"]
print("AGAIN", kolo.run(train, args=(0,), np=2, stream=False))
''',
    # 4: a worker's exception comes back into the cell
    '''
class Diverged(Exception):
    pass

def unstable():
    import kolo.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise Diverged("loss is nan on rank %d" % hvd.rank())
    return "fine"

try:
    kolo.run(unstable, np=2, stream=False)
except Diverged as e:
    print("CAUGHT", type(e).__name__, e)
    print("NOTES", " | ".join(getattr(e, "__notes__", []))[:300])
''',
]


def _text(cell):
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            out.append("%s: %s\n%s" % (o.get("ename"), o.get("evalue"),
                                       "\n".join(o.get("traceback", []))))
    return "".join(out)


def test_function_from_a_notebook_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src.strip()) for src in CELLS]
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["KOLO_BIN"] = KOLO
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env.setdefault("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail("a cell failed: %s" % e)
    outs = [_text(c) for c in nb.cells]
    print("\n---\n".join(outs))
    # the workers' output streamed into the cell, result lines taken out
    assert "[0]<stdout>:trained on rank 0 of 2" in outs[1], outs[1]
    assert "[1]<stdout>:trained on rank 1 of 2" in outs[1], outs[1]
    assert "RESULTS [(0, 63.0), (1, 63.0)]" in outs[1], outs[1]
    assert "@@kolo.run" not in outs[1]
    assert "AGAIN [(0, 3.0), (1, 3.0)]" in outs[2], outs[2]
    # the cell's own exception class, raised in the kernel, with the rank
    # and the worker's traceback in its notes
    assert "CAUGHT Diverged loss is nan on rank 1" in outs[3], outs[3]
    assert "rank 1" in outs[3].split("NOTES", 1)[1], outs[3]
