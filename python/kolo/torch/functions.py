"""Helpers that move whole models, optimizers and Python objects
(horovod/torch/functions.py semantics)."""
import io
import pickle

import torch

import kolo as _kolo
from .mpi_ops import (allgather, broadcast_, broadcast_async_, synchronize, _check_set,
                      global_process_set)

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - Debian ships it as an option
    _pickler = pickle


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's parameters into every rank's, in place.

    params: a state_dict-like mapping (broadcast in sorted key order), or a
    list of tensors or of (name, tensor) pairs such as
    model.named_parameters()."""
    _check_set(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in items:
        if p is None:
            continue
        if isinstance(p, torch.nn.Parameter) or p.requires_grad:
            p = p.data
        handles.append(broadcast_async_(p, root_rank, name, process_set))
    for h in handles:
        synchronize(h)


def _has_stateful_optimizer(optimizer):
    return len(optimizer.state_dict()["state"]) > 0


def _init_state(optimizer):
    """Gives an optimizer its state (momentum buffers, step counters) by one
    step with zero gradients, as Horovod does: afterwards every parameter
    that requires a gradient has a zero one (so `broadcast(p.grad)` works
    right after, as in Horovod), and the others keep None. The parameters
    are restored, so weight decay or momentum never moves them."""
    saved = []
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                saved.append((p, p.data.clone()))
                p.grad = torch.zeros_like(p.data)
                if sparse:
                    p.grad = p.grad.to_sparse()
    step = optimizer.step
    if getattr(optimizer, "_kolo_distributed", False):
        # a DistributedOptimizer's step() would allreduce: step the base class
        step = super(optimizer.__class__, optimizer).step
    step()
    with torch.no_grad():
        for p, data in saved:
            p.data.copy_(data)
            if not sparse:
                p.grad.zero_()


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Copies root_rank's optimizer state (per-parameter state tensors and
    scalars, and the options of every parameter group such as lr) into every
    rank's optimizer."""
    _check_set(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not _has_stateful_optimizer(optimizer):
        _init_state(optimizer)
    state = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tensors, scalars = [], {}
    for group in state["param_groups"]:
        for pid in group["params"]:
            pstate = state["state"].get(pid)
            if not pstate:
                continue
            for key in sorted(pstate, key=str):
                value = pstate[key]
                if torch.is_tensor(value):
                    tensors.append(("optimizer_state.%d.%s" % (pid, key), value))
                else:
                    scalars[(pid, key)] = value
    options = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    broadcast_parameters(tensors, root_rank, process_set)
    options, scalars = broadcast_object((options, scalars), root_rank,
                                        name="optimizer_state.options", process_set=process_set)
    for group, opts in zip(optimizer.param_groups, options):
        group.update(opts)
    for (pid, key), value in scalars.items():
        if pid < len(params):
            optimizer.state[params[pid]][key] = value


def _to_bytes(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (anything picklable), on every rank."""
    _check_set(process_set)
    name = name or type(obj).__name__
    if _kolo.rank() == root_rank:
        data = torch.frombuffer(bytearray(_to_bytes(obj)), dtype=torch.uint8)
        sz = torch.tensor([data.numel()], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
    else:
        sz = torch.tensor([0], dtype=torch.int64)
        broadcast_(sz, root_rank, name + ".sz", process_set)
        data = torch.empty(int(sz.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name + ".t", process_set)
    if _kolo.rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj` (anything picklable), as a list indexed by rank."""
    _check_set(process_set)
    name = name or type(obj).__name__
    data = torch.frombuffer(bytearray(_to_bytes(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=process_set)
    gathered = allgather(data, name=name + ".t", process_set=process_set).numpy().tobytes()
    res, off = [], 0
    for n in sizes.tolist():
        res.append(pickle.loads(gathered[off:off + n]))
        off += n
    return res
