"""DistributedOptimizer: Horovod's hook-driven gradient averaging.

Each parameter's gradient accumulator gets a hook: as soon as backward
produced a parameter's gradient, its allreduce is submitted, so
communication overlaps the rest of the backward pass. step() (or
synchronize()) waits for them and writes the averaged gradients back.
"""
import contextlib
import os
import warnings

import torch

import kolo as _kolo
from kolo import _report
from .compression import Compression
from .mpi_ops import (Adasum, Average, allreduce_async_, global_process_set,
                      grouped_allreduce_async_, sparse_allreduce_async, synchronize,
                      _check_set)


def _parameter_names(param_groups, named_parameters):
    """{parameter: name}, with Horovod's checks of named_parameters."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%s.%s" % (i, j), v)
                            for i, group in enumerate(param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         "Found duplicates: %s" % ", ".join(dups))
    all_ids = {id(v) for g in param_groups for v in g["params"]}
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = all_ids - named_ids
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters "
                         "were not named. Python object ids: %s"
                         % ", ".join(str(i) for i in sorted(unnamed)))
    return {v: k for k, v in sorted(named_parameters)}


def _count_pass(opt, p):
    """A gradient hook's bookkeeping (Horovod's checks): counts one backward
    pass of p; True when p's passes for this step are complete."""
    if p in opt._handles and opt._handles[p][0] is not None:
        if opt._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times "
                "before call to step(). Increase backward_passes_per_step to "
                "accumulate gradients locally.")
    assert not p.grad.requires_grad
    assert opt._allreduce_delay[p] > 0
    opt._allreduce_delay[p] -= 1
    return opt._allreduce_delay[p] == 0


def _refuse_zero_grad_in_flight(opt):
    if opt._handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                             "before optimizer.step() or optimizer.synchronize(). This is "
                             "prohibited as it can cause a race condition.")


_SPARSE = "sparse"  # the ctx of a sparse gradient's handle (a callable)


def _write_grad(p, value):
    """Puts a reduced gradient into p.grad: in place for dense gradients;
    a sparse .grad stays sparse (sparse tensors have no set_), as in
    Horovod, also when it was reduced dense (sparse_as_dense=True)."""
    if p.grad.is_sparse:
        if not value.is_sparse:
            value = value.to_sparse()
        p.grad.zero_().add_(value)
    else:
        p.grad.set_(value)


class _DistributedOptimizer(torch.optim.Optimizer):
    _kolo_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        # a rank outside the set keeps the optimizer but reduces nothing
        self.process_set = process_set
        self._included = bool(process_set.included())
        self._kolo_step_timer = _report.StepTimer()  # issue 6: step times

        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for v in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True

        # groups: parameters reduced together, as one fused operation
        self._groups = []
        self._p_to_group = {}
        self._group_counts = {}
        if groups is not None:
            if isinstance(groups, int):
                params_all = [p for g in self.param_groups for p in g["params"]
                              if p.requires_grad]
                if groups > 0:
                    n = len(params_all)
                    step = (n + groups - 1) // groups
                    grouped = [params_all[i:i + step] for i in range(0, n, step)]
                else:
                    grouped = []
            else:
                grouped = [list(g) for g in groups]
                if any(not isinstance(p, torch.Tensor) for g in grouped for p in g):
                    raise ValueError("groups must be a list of lists of torch.Tensor")
            for gi, g in enumerate(grouped):
                key = tuple(g)
                self._groups.append(key)
                for p in g:
                    self._p_to_group[p] = key
                self._group_counts[key] = 0

        # an elastic job may grow: hooks even at size 1 (Horovod's rule; the
        # coordinator sets HOROVOD_ELASTIC=1 for elastic jobs, as horovodrun does)
        if self._included and (process_set.size() > 1 or
                               os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    # no zero .grad made here (Horovod 0.28 neither): a
                    # sparse gradient must not land in a dense one
                    self._requires_update.add(p)
                    tmp = p.expand_as(p)
                    acc = tmp.grad_fn.next_functions[0][0]
                    acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(acc)

    def _scales(self):
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # not computed here (a dynamic graph), maybe on another rank
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                # Horovod's sparse path: allgather of indices and values;
                # the handle is a callable (synchronize below calls it)
                return sparse_allreduce_async(tensor, name=name, op=self.op,
                                              process_set=self.process_set), _SPARSE
            tensor = tensor.to_dense()  # reduced dense; .grad stays sparse
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_async(self, key):
        tensors, ctxs = [], []
        for p in key:
            t = p.grad
            if t.is_sparse:
                t = t.to_dense()  # reduced dense; .grad stays sparse
            c, ctx = self._compression.compress(t)
            tensors.append(c)
            ctxs.append(ctx)
        pre, post = self._scales()
        name = self._parameter_names.get(key[0])
        handle = grouped_allreduce_async_(tensors, name="group." + name, op=self.op,
                                          prescale_factor=pre, postscale_factor=post,
                                          process_set=self.process_set)
        return handle, (tensors, ctxs)

    def _make_hook(self, p):
        def hook(*ignore):
            handle, ctx = None, None
            if _count_pass(self, p):
                key = self._p_to_group.get(p)
                if key is None:
                    handle, ctx = self._allreduce_grad_async(p)
                else:
                    self._group_counts[key] += 1
                    if self._group_counts[key] == len(key):
                        handle, ctx = self._grouped_allreduce_async(key)
                        for q in key[:-1]:
                            self._handles[q] = (None, None)
                        self._group_counts[key] = 0
                        self._handles[p] = (handle, ("group", key, ctx))
                        return
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce and writes the results back
        into .grad; parameters whose hook did not fire are reduced now."""
        if not self._requires_update or not self._included:
            self._synchronized = True
            return
        missing = self._requires_update - set(self._handles.keys())
        for p in sorted(missing, key=lambda q: self._parameter_names.get(q, "")):
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
            key = self._p_to_group.get(p)
            if key is None:
                self._handles[p] = self._allreduce_grad_async(p)
        # groups whose hooks did not all fire: reduce them whole
        for key in self._groups:
            if any(self._handles.get(q, (None, None))[1] is not None and
                   isinstance(self._handles[q][1], tuple) and self._handles[q][1][:1] == ("group",)
                   for q in key):
                continue
            if any(q in missing or self._handles.get(q, (None, None))[0] is None for q in key):
                for q in key:
                    if q.grad is None:
                        q.grad = q.data.new(q.size()).zero_()
                handle, ctx = self._grouped_allreduce_async(key)
                for q in key[:-1]:
                    self._handles[q] = (None, None)
                self._handles[key[-1]] = (handle, ("group", key, ctx))
                self._group_counts[key] = 0

        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                if p not in self._p_to_group:
                    # delayed: this pass accumulates locally
                    handle, ctx = self._allreduce_grad_async(p)
                else:
                    continue
            if isinstance(ctx, tuple) and ctx[:1] == ("group",):
                _, key, (tensors, ctxs) = ctx
                outs = synchronize(handle)
                for q, out, c in zip(key, outs, ctxs):
                    self._allreduce_delay[q] = self.backward_passes_per_step
                    _write_grad(q, self._compression.decompress(out, c))
                continue
            self._allreduce_delay[p] = self.backward_passes_per_step
            if ctx is _SPARSE:
                _write_grad(p, handle())
                continue
            output = synchronize(handle)
            _write_grad(p, self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize again (use after an
        explicit synchronize(), e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        timer = getattr(self, "_kolo_step_timer", None)  # issue 6: time since the last step()
        if timer is not None:
            timer.tick()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        out = super(self.__class__, self).step(closure)
        if _report._recovery is not None:  # the first step after a reset is done
            _report.recovery_step_done()
        return out

    def zero_grad(self, *args, **kwargs):
        _refuse_zero_grad_in_flight(self)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """DistributedOptimizer(op=hvd.Adasum), Horovod's delta optimizer: as
    soon as a parameter's gradient is ready, the wrapped optimizer steps that
    parameter alone, locally; the change it made (the delta) is what the
    ranks combine with Adasum, and step() puts the parameter at its start
    plus the combined delta."""
    _kolo_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._kolo_step_timer = _report.StepTimer()  # issue 6: step times
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for v in self._parameter_names}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._starts = {v: torch.zeros_like(v, requires_grad=False)
                        for v in self._parameter_names}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    self._requires_update.add(p)
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(acc)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _delta_async(self, p):
        start = self._starts[p]
        # the wrapped optimizer's step, on p alone
        kept = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            start.data.copy_(p.data)
            super(self.__class__, self).step()
            p.data.sub_(start)  # p holds its delta until step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group["params"] = params
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum)
        return handle, ctx

    def _make_hook(self, p):
        def hook(*ignore):
            handle, ctx = None, None
            if _count_pass(self, p):
                handle, ctx = self._delta_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        pass  # step() does it all, as in Horovod

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pragma: no cover (a context manager that never enters)

    def step(self, closure=None):
        self._kolo_step_timer.tick()
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._delta_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # step() before backward_passes_per_step passes
                handle, ctx = self._delta_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starts[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        if _report._recovery is not None:  # the first step after a reset is done
            _report.recovery_step_done()
        return loss

    def zero_grad(self, *args, **kwargs):
        _refuse_zero_grad_in_flight(self)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that step() applies gradients averaged over all
    ranks (Horovod's DistributedOptimizer, same arguments and errors)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of lists of "
                         "torch.Tensor.")
    if process_set.process_set_id is None:
        raise ValueError("%s has not been added (hvd.add_process_set or init(process_sets=...))"
                         % (process_set,))
    if op == Adasum and _kolo.size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
