"""Collectives on torch tensors with Horovod's signatures and semantics
(horovod/torch/mpi_ops.py): asynchronous forms return an integer handle
for poll()/synchronize(); the synchronous forms support autograd; names
ending in `_` work in place."""
import collections.abc

import torch

import kolo as _kolo
from .. import _engine as E
from .._engine import Average, Sum, Adasum, Min, Max, Product  # noqa: F401
from .compression import Compression
from ..exceptions import HorovodInternalError

_DTYPES = {
    torch.uint8: E.UINT8,
    torch.int8: E.INT8,
    torch.int16: E.INT16,
    torch.int32: E.INT32,
    torch.int64: E.INT64,
    torch.float16: E.FLOAT16,
    torch.bfloat16: E.BFLOAT16,
    torch.float32: E.FLOAT32,
    torch.float64: E.FLOAT64,
}


from ..process_sets import (ProcessSet, global_process_set, add_process_set,  # noqa: F401
                            remove_process_set)
from .. import process_sets as _P

# Horovod's mpi_ops holds the basics too (its own functions.py and
# elastic/sampler.py import rank and size from here).
from kolo import (init, shutdown, is_initialized, size, rank, local_size, local_rank,  # noqa
                  cross_size, cross_rank, is_homogeneous)


def handle_average_backwards_compatibility(op, average):
    """The op that Horovod's deprecated `average` argument stands for:
    op if given (not both), else Average or Sum by average, else Average."""
    if op is not None and average is None:
        return op
    return E.resolve_op(op, average, adasum=True)


# ---------------------------------------------------------------- build information
# kolo's CPU collectives are its own (TCP and shared-memory rings), never MPI
# or Gloo; GPU tensors go through NCCL when libkolo was built with the CUDA
# and NCCL headers (docs/gpu.md). CUDA and NCCL themselves are loaded only
# when a job first uses a GPU tensor.

def mpi_built(verbose=False):
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built(verbose=False):
    return False


def gloo_enabled():
    return False


def nccl_built(verbose=False):
    """The NCCL version libkolo's GPU backend was built against, as Horovod
    reports it (e.g. 22809), or 0 when it has none."""
    return int(E.gpu_build_info()[0])


def cuda_built(verbose=False):
    """True when libkolo's GPU backend (CUDA tensors over NCCL) was built."""
    return E.gpu_build_info()[1] > 0


def rocm_built(verbose=False):
    return False


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def sycl_built(verbose=False):
    """Intel's Horovod fork asks it; kolo has no SYCL backend."""
    return False


def mlsl_built(verbose=False):
    """Horovod before 0.20 asked it; kolo has no MLSL backend."""
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the job's timeline to file_path (Horovod's Chrome-trace
    format). kolo's coordinator writes it, with every rank's negotiation, on
    its host; a relative path is taken from the job's working directory.
    Every rank may call it with the same path. mark_cycles is accepted and
    ignored (kolo has no cycles)."""
    _timeline_call(str(file_path))


def stop_timeline():
    """Stops the timeline started by start_timeline or --timeline-filename."""
    _timeline_call(None)


def _timeline_call(path):
    eng = _kolo._eng()
    # started alone, libkolo refuses it: the coordinator writes the timeline
    with eng.borrow() as (lib, ctx):
        rc = lib.kolo_timeline(ctx, path.encode() if path else None)
        if rc:
            detail = lib.kolo_last_error(ctx)
            raise ValueError("kolo: %s (%s)" % (detail.decode(errors="replace") if detail else
                                                lib.kolo_strerror(rc).decode(),
                                                lib.kolo_errname(rc).decode()))



def _set_topo(process_set):
    """(rank, size) of this process within process_set (the job's for the
    global set); Horovod's ValueError outside it."""
    t = _P.engine_for(process_set).topology()
    return t[0], t[1]


def _check_set(process_set, what="collective"):
    _P.engine_for(process_set, what)


def _set_root(process_set, root_rank):
    """A broadcast's root, a job rank as in Horovod, as a rank of the set."""
    if process_set is None or process_set is global_process_set:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError("root rank %d is not in %s" % (root_rank, process_set))
    return process_set.ranks.index(root_rank)


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("expected a torch.Tensor, got %s" % type(tensor).__name__)
    code = _DTYPES.get(tensor.dtype)
    if code is None or tensor.layout != torch.strided:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError("kolo: %s tensors are not supported; use CPU or CUDA tensors"
                         % tensor.device.type)
    return code


def _p(t):
    return t.data_ptr() if t.numel() else 0


# ---------------------------------------------------------------- GPU tensors
# A CUDA tensor's request names its device and PyTorch's current stream on
# it: libkolo's NCCL backend starts the operation on the GPU once the work
# queued on that stream so far is done, without a host synchronisation
# (docs/gpu.md). That holds for a program started alone too (libkolo's
# one-rank context).

def _device(t):
    if t.device.type != "cuda":
        return -1
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _gpu(t):
    """The Req keywords for tensor t (nothing for a CPU tensor)."""
    if t.device.type != "cuda":
        return {}
    return {"device": _device(t), "stream": torch.cuda.current_stream(t.device).cuda_stream}


def _submit(reqs, keep, finish, process_set=None):
    return _P.engine_for(process_set).submit(reqs, keep, finish)


class _HandleMap(collections.abc.Mapping):
    """Horovod's `mpi_ops._handle_map` (handle -> the tensors an op keeps
    alive until synchronize()), as a read-only view of kolo's pending
    operations: `handle in _handle_map`, `len(_handle_map)` (how many ops
    were never synchronized) and iteration work as on Horovod's dict.
    Changing it is not supported: dropping an op's tensors while libkolo
    may still write into them is what kolo's shutdown() guards against."""

    def __getitem__(self, handle):
        eng = E.owner(handle)
        kept = eng.kept(handle) if eng is not None else None
        if kept is None:
            raise KeyError(handle)
        return kept

    def __iter__(self):
        return iter(E.live_handles())

    def __len__(self):
        return len(E.live_handles())


_handle_map = _HandleMap()


def poll(handle):
    """True if the operation behind `handle` finished (then synchronize()
    returns at once)."""
    return _kolo.poll(handle)


def synchronize(handle):
    """Waits for the operation and returns its output; raises
    HorovodInternalError if it failed."""
    return _kolo.synchronize(handle)


# ---------------------------------------------------------------- allreduce

def _allreduce_req(tensor, output, name, op, prescale_factor, postscale_factor):
    code = _check(tensor)
    return E.Req(E.ALLREDUCE, name, _p(tensor), _p(output), code, tensor.shape, E.kolo_op(op),
                 prescale_factor, postscale_factor, **_gpu(tensor))


# Adasum (Maleki et al.; Horovod's op=hvd.Adasum): two gradients a and b
# combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, so parallel parts
# add and the part they share counts once. Ranks combine pairwise, by
# distance 1, 2, 4, ... (Horovod's recursive halving), each tensor on its
# own. kolo computes it from an allgather of every rank's tensor, combined
# in float64 on each rank in that same order: the same result as Horovod's,
# for size times the traffic of an allreduce.

def _adasum_pair(a, b):
    dot = torch.dot(a, b)
    an, bn = torch.dot(a, a), torch.dot(b, b)
    ca = 1.0 - dot / (2 * an) if an != 0 else 1.0
    cb = 1.0 - dot / (2 * bn) if bn != 0 else 1.0
    return ca * a + cb * b


def _adasum_rows(rows):
    """Every rank's tensor as a row (float64), combined pairwise."""
    vecs = list(rows)
    while len(vecs) > 1:  # a power of 2: pairs at distance 1, then 2, ...
        vecs = [_adasum_pair(vecs[i], vecs[i + 1]) for i in range(0, len(vecs), 2)]
    return vecs[0]


def _adasum_submit(ins, outs, name, prescale_factor, postscale_factor, result, process_set):
    """Adasum of each tensor of `ins` into `outs` (the same tensors when in
    place), as one group; `result()` is what synchronize returns."""
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = _kolo.size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported "
                                  "yet.")
    for t in ins:
        if _check(t) not in E.FLOATING:
            raise ValueError("Adasum needs floating-point tensors, not %s" % t.dtype)
    flat = [(t * prescale_factor if prescale_factor != 1.0 else t).reshape(1, -1).contiguous()
            for t in ins]
    names = [name] if len(ins) == 1 else [E.group_name(name, i, len(ins))
                                           for i in range(len(ins))]
    reqs = [_allgather_req(f, nm) for f, nm in zip(flat, names)]

    def finish(res):
        for f, r, out in zip(flat, res, outs):
            rows = _rows_out(f, r).to(torch.float64)
            v = _adasum_rows(rows) * postscale_factor
            out.copy_(v.reshape(out.shape).to(out.dtype))
        return result()

    return _submit(reqs, (ins, flat, outs), finish, process_set)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    tensor = tensor.detach()
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if op == Adasum:
        return _adasum_submit([tensor], [output], name, prescale_factor, postscale_factor,
                              lambda: output, process_set)
    r = _allreduce_req(tensor, output, name, op, prescale_factor, postscale_factor)
    return _submit([r], (tensor, output), lambda res: output, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    t = tensor.detach()
    if op == Adasum:
        return _adasum_submit([t], [t], name, prescale_factor, postscale_factor, lambda: tensor,
                              process_set)
    r = _allreduce_req(t, t, name, op, prescale_factor, postscale_factor)
    return _submit([r], t, lambda res: tensor, process_set)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, name=name, op=op,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor,
                                           process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        return allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.pre,
                         postscale_factor=ctx.post, process_set=ctx.ps), None, None, None, None, \
            None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of `tensor` over all ranks (default: the average), as a
    new tensor. Differentiable: the gradient is the same reduction of the
    output's gradient."""
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """allreduce in place: `tensor` receives the result."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    ins = [t.detach() for t in tensors]
    outs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in ins]
    if op == Adasum:
        return _adasum_submit(ins, outs, name, prescale_factor, postscale_factor,
                              lambda: tuple(outs), process_set)
    reqs = [_allreduce_req(t, o, E.group_name(name, i, len(ins)), op, prescale_factor,
                           postscale_factor) for i, (t, o) in enumerate(zip(ins, outs))]
    return _submit(reqs, (ins, outs), lambda res: tuple(outs), process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    ins = [t.detach() for t in tensors]
    if op == Adasum:
        return _adasum_submit(ins, ins, name, prescale_factor, postscale_factor,
                              lambda: tuple(tensors), process_set)
    reqs = [_allreduce_req(t, t, E.group_name(name, i, len(ins)), op, prescale_factor,
                           postscale_factor) for i, t in enumerate(ins)]
    return _submit(reqs, ins, lambda res: tuple(tensors), process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        red = grouped_allreduce([g.contiguous() for g in grads], op=ctx.op,
                                prescale_factor=ctx.pre, postscale_factor=ctx.post,
                                process_set=ctx.ps)
        return (None, None, None, None, None) + tuple(red)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Reduces a list of tensors as one negotiated, fused operation."""
    _check_set(process_set)
    op = E.resolve_op(op, average, adasum=True)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---------------------------------------------------------------- allgather

def _rows_out(t, res):
    out = t.new_empty((res.rows,) + tuple(t.shape[1:]))
    if out.numel():
        res.copy_to(out.data_ptr())
    return out


def _allgather_req(t, name):
    code = _check(t)
    if t.dim() == 0:
        raise ValueError("Process-set rank zero tried to allgather a rank-zero tensor.")
    return E.Req(E.ALLGATHER, name, _p(t), 0, code, t.shape, **_gpu(t))


def allgather_async(tensor, name=None, process_set=global_process_set):
    _check_set(process_set)
    t = tensor.detach()
    return _submit([_allgather_req(t, name)], t, lambda res: _rows_out(t, res[0]), process_set)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim, ctx.ps = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.ps)
        offset = int(dims[:_set_topo(ctx.ps)[0]].sum().item())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated on the first dimension, which may
    differ between ranks; the other dimensions must match."""
    _check_set(process_set)
    _allgather_req(tensor, name)  # refuses bad tensors before autograd sees them
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    _check_set(process_set)
    ins = [t.detach() for t in tensors]
    reqs = [_allgather_req(t, E.group_name(name, i, len(ins))) for i, t in enumerate(ins)]
    return _submit(reqs, ins, lambda res: tuple(_rows_out(t, r) for t, r in zip(ins, res)),
                   process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims, ctx.ps = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        # Horovod's: the average of the gradients, each rank's own rows
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                    process_set=ctx.ps)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                 process_set=ctx.ps)
        r = _set_topo(ctx.ps)[0]
        out = [g.narrow(0, int(d[:r].sum().item()), own)
               for g, d, own in zip(reduced, dims, ctx.dims)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, negotiated and fused as one group;
    differentiable."""
    _check_set(process_set)
    for i, t in enumerate(tensors):
        _allgather_req(t, None)  # refuses bad tensors before autograd sees them
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- sparse

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse COO tensor as Horovod does: every rank's indices and
    values are allgathered (as `<name>.indices` and `<name>.values`); the
    result has every rank's entries (coalesced: entries at the same index
    summed), values divided by the size for Average. Returns a callable
    that waits and returns the result (Horovod's handle for sparse ops)."""
    _check_set(process_set)
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports only op=Average or op=Sum")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # allgather concatenates the first dimension: indices go transposed
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(),
                         name=name + ".indices" if name else None, process_set=process_set)
    vh = allgather_async(t._values().contiguous(),
                         name=name + ".values" if name else None, process_set=process_set)
    n = _set_topo(process_set)[1]

    def handle():
        values = synchronize(vh)
        indices = synchronize(ih)
        if op == Average:
            values = values / n
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size()).coalesce()

    return handle


# ---------------------------------------------------------------- broadcast

def _broadcast_req(t, root_rank, name, process_set):
    code = _check(t)
    return E.Req(E.BROADCAST, name, _p(t), _p(t), code, t.shape,
                 root=_set_root(process_set, root_rank), **_gpu(t))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank (a job rank, as in Horovod) sends; the others receive."""
    _check_set(process_set)
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return _submit([_broadcast_req(out, root_rank, name, process_set)], out, lambda res: out,
                   process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_set(process_set)
    t = tensor.detach()
    return _submit([_broadcast_req(t, root_rank, name, process_set)], t, lambda res: tensor,
                   process_set)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.ps = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        if _kolo.rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor, on every rank (a new tensor; differentiable)."""
    _check_set(process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast in place: `tensor` receives root_rank's values."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _check_set(process_set)
    t = tensor.detach()
    code = _check(t)
    if t.dim() == 0:
        raise ValueError("Process-set rank zero tried to alltoall a rank-zero tensor.")
    sp = None
    if isinstance(splits, torch.Tensor):
        # Horovod's checks (operations.cc), raised before anything is sent
        if splits.dim() > 1:
            raise ValueError("alltoall expects a 1D splits tensor")
        if splits.dtype != torch.int32:
            raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
        sp = [int(s) for s in splits.tolist()]
    elif splits is not None:
        sp = [int(s) for s in splits]
    r = E.Req(E.ALLTOALL, name, _p(t), 0, code, t.shape, splits=sp, **_gpu(t))

    # the received splits live where the splits given did, as Horovod's
    # (splits.new()): a CUDA splits tensor gets CUDA received splits
    sdev = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")

    def finish(res):
        recv = torch.tensor(res[0].recv_splits, dtype=torch.int32)
        return _rows_out(t, res[0]), recv if sdev.type == "cpu" else recv.to(sdev)

    return _submit([r], t, finish, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, recv = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.recv, ctx.ps = recv, process_set
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, _):
        g, _ = synchronize(alltoall_async(grad.contiguous(), ctx.recv, process_set=ctx.ps))
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] first-dimension rows to rank i (default: an even
    share) and returns the rows received, concatenated in rank order; with
    splits given, also how many rows came from each rank."""
    _check_set(process_set)
    if _check(tensor) is not None and tensor.dim() == 0:
        raise ValueError("Process-set rank zero tried to alltoall a rank-zero tensor.")
    out, recv = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, recv)


# ---------------------------------------------------------------- reducescatter

def _reducescatter_req(t, name, op, prescale_factor, postscale_factor, process_set):
    if op not in (Average, Sum):
        # Horovod aborts the op (a RuntimeError), with this text
        raise HorovodInternalError("Reducescatter currently only supports SUM.")
    code = _check(t)
    if t.dim() == 0:
        raise ValueError("Process-set rank zero tried to reducescatter a rank-zero tensor.")
    me, n = _set_topo(process_set)
    out = t.new_empty((E.scatter_rows(t.shape[0], n, me),) + tuple(t.shape[1:]))
    return out, E.Req(E.REDUCESCATTER, name, _p(t), _p(out), code, t.shape, E.kolo_op(op),
                      prescale_factor, postscale_factor, **_gpu(t))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    _check_set(process_set)
    t = tensor.detach()
    out, r = _reducescatter_req(t, name, op, prescale_factor, postscale_factor, process_set)
    return _submit([r], (t, out), lambda res: out, process_set)


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set):
    # Horovod's backward (torch/mpi_ops.py): the incoming gradient times the
    # set's size for Sum (as is for Average), times both scale factors, then
    # allgathered.
    n = _set_topo(process_set)[1]
    return (n if op == Sum else 1) * prescale_factor * postscale_factor


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor,
                                              process_set)
        ctx.ps = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set=process_set,
                                               prescale_factor=prescale_factor,
                                               postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous()
        if ctx.scale != 1.0:
            g = g * ctx.scale
        return allgather(g, process_set=ctx.ps), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks (Sum or Average) and leaves each rank its share of
    the first dimension: rows // size, one more for the first rows % size
    ranks. Differentiable."""
    _check_set(process_set)
    compressed, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    _check_set(process_set)
    ins = [t.detach() for t in tensors]
    pairs = [_reducescatter_req(t, E.group_name(name, i, len(ins)), op, prescale_factor,
                                postscale_factor, process_set) for i, t in enumerate(ins)]
    outs = [p[0] for p in pairs]
    return _submit([p[1] for p in pairs], (ins, outs), lambda res: tuple(outs), process_set)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor,
                                              process_set)
        ctx.ps = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set=process_set, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        gs = [g.contiguous() * ctx.scale if ctx.scale != 1.0 else g.contiguous() for g in grads]
        return (None, None, None, None, None) + tuple(grouped_allgather(gs, process_set=ctx.ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor as one group; differentiable."""
    _check_set(process_set)
    pairs = [compression.compress(t) for t in tensors]
    if not pairs:
        return []
    outs = _GroupedReducescatter.apply(name, op, prescale_factor, postscale_factor, process_set,
                                       *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ---------------------------------------------------------------- barrier and join

def barrier(process_set=global_process_set):
    """Returns once every rank called barrier()."""
    _check_set(process_set)
    synchronize(_submit([E.Req(E.BARRIER)], None, lambda res: None, process_set))


def join(device=-1):
    """This rank ran out of data: until every rank joined, it contributes
    zeros to the others' allreduces. Returns the last rank that joined.
    `device`: the GPU those zeros live on when the others reduce CUDA
    tensors (-1: CPU), as in Horovod."""
    device = int(device) if device is not None else -1
    if device >= 0 and not torch.cuda.is_available():
        # no GPU here: the zeros live on the CPU, as Horovod built for CPU
        # treats the argument (join(hvd.local_rank()) in GPU-ready scripts)
        device = -1
    return synchronize(_submit([E.Req(E.JOIN, device=device)], None,
                               lambda res: int(res[0].value)))
