"""Horovod's module names for kolo's, so that code which imports horovod
itself (a library such as PyTorch Lightning's Horovod strategy, a test
suite, a script one cannot edit) runs on kolo:

    import kolo.as_horovod         # from here on:
    import horovod.torch as hvd    # is kolo.torch

or, changing no code at all, with the alias package first on the path:

    PYTHONPATH=$(python3 -m kolo.as_horovod --path) kolo run -np 2 -- python3 train.py

The names: horovod (horovod.run is kolo.run), horovod.torch and its
modules (mpi_ops, functions, compression, optimizer, sync_batch_norm,
elastic with state and sampler), horovod.common.exceptions,
horovod.common.process_sets, horovod.common.elastic (State, ObjectState,
run_fn) and horovod.common.util (check_extension, gpu_available,
split_list). A real horovod imported before is left alone: importing
this module then raises ImportError.
"""
import os
import sys
import types

import kolo
import kolo.exceptions
import kolo.process_sets
import kolo.torch
import kolo.torch.compression
import kolo.torch.elastic
import kolo.torch.elastic.sampler
import kolo.torch.elastic.state
import kolo.torch.functions
import kolo.torch.mpi_ops
import kolo.torch.optimizer
import kolo.torch.sync_batch_norm

# horovod's modules that are kolo's modules as they are
_SAME = {
    "horovod.torch": kolo.torch,
    "horovod.torch.mpi_ops": kolo.torch.mpi_ops,
    "horovod.torch.functions": kolo.torch.functions,
    "horovod.torch.compression": kolo.torch.compression,
    "horovod.torch.optimizer": kolo.torch.optimizer,
    "horovod.torch.sync_batch_norm": kolo.torch.sync_batch_norm,
    "horovod.torch.elastic": kolo.torch.elastic,
    "horovod.torch.elastic.state": kolo.torch.elastic.state,
    "horovod.torch.elastic.sampler": kolo.torch.elastic.sampler,
    "horovod.common.exceptions": kolo.exceptions,
    "horovod.common.process_sets": kolo.process_sets,
}


def _run_fn(func, reset):
    """horovod.common.elastic.run_fn: kolo's elastic run (reset is kolo's)."""
    return kolo.torch.elastic.run(func)


# horovod's modules that gather names kolo keeps elsewhere
_GATHERED = {
    "horovod.common.util": {"check_extension": kolo.torch.check_extension,
                            "gpu_available": kolo.torch.gpu_available,
                            "split_list": kolo.torch.split_list},
    "horovod.common.elastic": {"State": kolo.torch.elastic.State,
                               "ObjectState": kolo.torch.elastic.ObjectState,
                               "run_fn": _run_fn},
}


def path():
    """The folder whose `horovod` package is this alias (for PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_alias")


def _package(name, doc):
    m = sys.modules.get(name)
    if m is None:
        m = types.ModuleType(name, doc)
        m.__path__ = []  # a package: its submodules are the entries below
        sys.modules[name] = m
    return m


def install():
    """Registers the names (idempotent)."""
    top = sys.modules.get("horovod")
    if top is not None and not getattr(top, "__kolo_alias__", False):
        raise ImportError("kolo.as_horovod: a real horovod (%s) was imported before; kolo does "
                          "not replace it" % getattr(top, "__file__", "?"))
    top = _package("horovod", "horovod's names for kolo (kolo.as_horovod)")
    top.__kolo_alias__ = True
    top.__version__ = kolo.__version__
    top.run = kolo.run
    common = _package("horovod.common", "horovod.common's names for kolo's")
    top.common = common
    for name, module in _SAME.items():
        sys.modules[name] = module
    for name, names in _GATHERED.items():
        m = _package(name, "%s's names for kolo's" % name)
        m.__dict__.update(names)
    top.torch = kolo.torch
    for name in ("exceptions", "process_sets", "util", "elastic"):
        setattr(common, name, sys.modules["horovod.common." + name])


install()

if __name__ == "__main__":
    if sys.argv[1:] == ["--path"]:
        print(path())
    else:
        print("usage: python3 -m kolo.as_horovod --path", file=sys.stderr)
        sys.exit(2)
