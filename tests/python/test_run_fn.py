"""kolo.run(fn): a function, shipped with cloudpickle, run on np workers of
a real `kolo run` job (embedded coordinator and agent), results back in
rank order; what a notebook cell does (horovod.run, HorovodRunner)."""
import os
import sys
import tempfile

import pytest

from conftest import KOLO, PYDIR  # noqa: F401  (PYDIR on sys.path)

cloudpickle = pytest.importorskip("cloudpickle")
import kolo  # noqa: E402


@pytest.fixture(autouse=True)
def _kolo_bin(monkeypatch, tmp_path):
    monkeypatch.setenv("KOLO_BIN", KOLO)
    # each run's embedded coordinator keeps its database here, not in ~
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _allreduce_rank(offset, scale=1.0):
    import numpy as np
    import kolo as k
    k.init()
    r = k.rank()
    total = k.allreduce(np.array([r + offset], dtype=np.float64), op=k.Sum)
    print("rank %d of %d" % (r, k.size()), flush=True)
    k.shutdown()
    return {"rank": r, "sum": float(total[0]) * scale}


def test_results_in_rank_order(capsys):
    got = kolo.run(_allreduce_rank, args=(10,), kwargs={"scale": 2.0}, np=3)
    # ranks 0..2 add 10, 11, 12: 33, scaled by 2
    assert got == [{"rank": r, "sum": 66.0} for r in range(3)]
    out = capsys.readouterr().out
    for r in range(3):
        assert "[%d]<stdout>:rank %d of 3" % (r, r) in out  # streamed to the caller
    assert "@@kolo.run" not in out  # result lines are taken out


def test_closure_and_lambda():
    base = {"k": 7}
    assert kolo.run(lambda: base["k"] * 6, np=1) == [42]

    def closure(n):
        import kolo as k
        k.init()
        try:
            return [base["k"] + n + k.rank()]
        finally:
            k.shutdown()
    assert kolo.run(closure, args=(1,), np=2) == [[8], [9]]


def test_big_payload_goes_through_the_directory():
    blob = bytes(range(256)) * 1024  # 256 KiB: over the environment's limit
    got = kolo.run(lambda b: (len(b), b[:4]), args=(blob,), np=2, stream=False)
    assert got == [(len(blob), blob[:4])] * 2


class Custom(Exception):
    pass


def _fails_on_rank_1():
    import kolo as k
    k.init()
    r = k.rank()
    k.shutdown()
    if r == 1:
        raise Custom("bad batch on rank %d" % r)
    return r


def test_worker_exception_is_raised_with_rank_and_traceback():
    with pytest.raises(Custom, match="bad batch on rank 1") as info:
        kolo.run(_fails_on_rank_1, np=2, stream=False)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    cause = str(info.value.__cause__)
    for text in (notes, cause):
        assert "rank 1" in text and "_fails_on_rank_1" in text, text


def _unpicklable():
    import threading

    class Holder(Exception):
        def __init__(self):
            super().__init__("holds a lock")
            self.lock = threading.Lock()
    raise Holder()


def _rank1_raises():
    import numpy as np
    import kolo as k
    k.init()
    if k.rank() == 1:
        raise ValueError("the real cause, on rank 1")
    k.allreduce(np.ones(2), name="never.matched")  # fails once rank 1 left
    k.shutdown()


def test_the_cause_is_raised_not_its_consequence():
    # rank 0's allreduce fails with HorovodInternalError because rank 1
    # raised and left: the caller gets rank 1's ValueError, as its own
    # script would
    with pytest.raises(ValueError, match="the real cause, on rank 1") as info:
        kolo.run(_rank1_raises, np=2)
    assert "rank 1" in str(info.value.__cause__)


def test_unpicklable_exception_comes_back_as_text():
    with pytest.raises(kolo._run.WorkerError, match="Holder: holds a lock"):
        kolo.run(_unpicklable, np=1, stream=False)


def test_a_killed_worker_fails_the_call():
    def die():
        import os as o
        o._exit(3)
    with pytest.raises(RuntimeError, match=r"exit code 3"):
        kolo.run(die, np=2, stream=False)


def test_notebook_cell(capsys):
    """A cell's source run with exec in a namespace of its own, as Jupyter
    does: the function lives in no importable module."""
    cell = '''
import kolo
def train(lr):
    import kolo as k
    k.init()
    import numpy as np
    g = k.allreduce(np.full(2, lr * (k.rank() + 1)), op=k.Average)
    k.shutdown()
    return round(float(g[0]), 6)
results = kolo.run(train, args=(0.5,), np=2)
'''
    ns = {"__name__": "__main__"}
    exec(compile(cell, "<cell>", "exec"), ns)
    assert ns["results"] == [0.75, 0.75]


def test_bad_arguments():
    with pytest.raises(TypeError):
        kolo.run(42)
    with pytest.raises(ValueError):
        kolo.run(lambda: 1, np=0)


def test_horovod_arguments_accepted():
    # horovod.run's SSH/MPI/Gloo knobs mean nothing here and are ignored
    assert kolo.run(lambda: "ok", np=1, use_gloo=True, ssh_port=22, network_interface="lo",
                    stream=False) == ["ok"]


def test_forged_result_lines_are_not_unpickled(tmp_path, capsys):
    """Issue 28: kolo.run unpickles only lines MAC'd with the call's secret.
    Output that merely looks like a result or an error (printed by the job,
    or injected by anyone who reaches its output) is printed, not loaded."""
    victim = tmp_path / "unpickled"

    def forge(path):
        import base64
        import pickle
        import kolo._run as r

        class Boom:
            def __reduce__(self):
                return (open, (path, "w"))
        blob = base64.b64encode(pickle.dumps((Boom(), "tb"))).decode()
        print(r.ERROR_MARK + blob, flush=True)               # the old format
        print(r.ERROR_MARK + "0" * 64 + " " + blob, flush=True)  # a wrong MAC
        print(r.RESULT_MARK + "0" * 64 + " " + blob, flush=True)
        return "real"

    assert kolo.run(forge, args=(str(victim),), np=1) == ["real"]
    assert not victim.exists(), "a forged line was unpickled"
    out = capsys.readouterr().out
    assert out.count("@@kolo.run.error@@") == 2 and "@@kolo.run.result@@" in out  # printed
