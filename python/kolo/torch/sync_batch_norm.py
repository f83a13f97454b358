"""hvd.SyncBatchNorm: batch normalization over the whole global batch.

In training every rank computes its per-channel count, mean and biased
variance; one allgather brings every rank's three to every rank, which
combine them (Chan's parallel formula: no sum of squares, so no loss of
precision when the mean is large). The backward pass needs two global
per-channel sums of the incoming gradient, one allreduce. As in Horovod,
the weight and bias gradients stay local: DistributedOptimizer averages
them with the other gradients. Evaluation with running statistics is
local. Running statistics are updated with the global mean and the
unbiased global variance, as nn.BatchNorm does on the concatenated batch.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import kolo as _kolo
from .mpi_ops import Sum, allgather, allreduce


class SyncBatchNorm(_BatchNorm):
    """Horovod's SyncBatchNorm(num_features, eps=1e-5, momentum=0.1,
    affine=True, track_running_stats=True), for inputs of 2 to 5
    dimensions (N, C, ...)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        batch_stats = self.training or not self.track_running_stats
        if not batch_stats or _kolo.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, batch_stats, factor, self.eps)
        running = self.training and self.track_running_stats
        return _SyncBatchNorm.apply(input, self.weight, self.bias,
                                    self.running_mean if running else None,
                                    self.running_var if running else None, self.eps, factor)


def _per_channel(x):
    """x (N, C, ...) as (C, N * ...): one row per channel."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        x = input.contiguous()
        rows = _per_channel(x.detach()).to(torch.float64)
        count = rows.shape[1]
        mean = rows.mean(dim=1)
        var = rows.var(dim=1, unbiased=False) if count else torch.zeros_like(mean)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                           mean, var])
        every = allgather(local.unsqueeze(0), name="sync_batch_norm.stats.%d" % x.shape[1])
        c = x.shape[1]
        counts, means, vars_ = every[:, :1], every[:, 1:1 + c], every[:, 1 + c:]
        total = counts.sum()
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got input "
                             "size {}".format(list(input.shape)))
        gmean = (counts * means).sum(dim=0) / total
        gvar = (counts * (vars_ + (means - gmean) ** 2)).sum(dim=0) / total
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(gmean.to(running_mean.dtype), alpha=momentum)
            unbiased = gvar * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        invstd = 1.0 / torch.sqrt(gvar + eps)
        shape = _channel_shape(x)
        mean_t = gmean.to(x.dtype).view(shape)
        invstd_t = invstd.to(x.dtype).view(shape)
        xhat = (x - mean_t) * invstd_t
        out = xhat
        if weight is not None:
            out = out * weight.view(shape) + bias.view(shape)
        ctx.save_for_backward(x, weight, mean_t, invstd_t)
        ctx.total = float(total)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        dy = grad_out.contiguous()
        xmu = x - mean
        rows_dy = _per_channel(dy)
        rows_dyxmu = _per_channel(dy * xmu)
        sum_dy = rows_dy.sum(dim=1)
        sum_dy_xmu = rows_dyxmu.sum(dim=1)
        grad_input = grad_weight = grad_bias = None
        if weight is not None:
            # local, as in Horovod: the optimizer averages them
            grad_weight = (sum_dy_xmu * invstd.view(-1)) if ctx.needs_input_grad[1] else None
            grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        if ctx.needs_input_grad[0]:
            both = allreduce(torch.cat([sum_dy, sum_dy_xmu]).to(torch.float64), op=Sum,
                             name="sync_batch_norm.grad.%d" % x.shape[1])
            c = x.shape[1]
            shape = _channel_shape(x)
            mean_dy = (both[:c] / ctx.total).to(x.dtype).view(shape)
            mean_dy_xmu = (both[c:] / ctx.total).to(x.dtype).view(shape)
            scale = invstd if weight is None else invstd * weight.view(shape)
            grad_input = (dy - mean_dy - xmu * invstd * invstd * mean_dy_xmu) * scale
        return grad_input, grad_weight, grad_bias, None, None, None, None
