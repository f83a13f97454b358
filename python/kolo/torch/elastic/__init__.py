"""Elastic training with kolo.torch: horovod.torch.elastic's API.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):
                ...
                state.commit()          # every few batches or once per epoch

    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0)
    train(state)

How a reset goes (the same as Horovod):
  - a collective fails (a worker died, its host vanished): every survivor
    gets HorovodInternalError; `run` restores the last commit, leaves the
    old generation (shutdown + init asks the coordinator for this worker's
    new place), runs the reset callbacks and broadcasts the state from the
    new rank 0;
  - hosts were added (or drained): the coordinator tells the workers, rank
    0's view is broadcast at the next commit() or check_host_updates(),
    and every rank raises HostsUpdatedInterrupt there; `run` re-forms the
    ring without a rollback.

What kolo adds: commit() also ships a durable snapshot of the committed
state from rank 0 to the coordinator, in the background (the latest one
wins when commits come faster than the network), where it is written to
SQLite before it is acknowledged. A rank 0 that starts with nothing of its
own (every worker of the job died, or the job was resubmitted with the
same coordinator job) loads the latest acknowledged snapshot before the
first broadcast, so training goes on from there. KOLO_DURABLE_COMMIT=0
turns the shipping off.
"""
import functools

import kolo as _kolo
from kolo import _report
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from .sampler import ElasticSampler
from .state import (State, ObjectState, TorchState, StateHandler, ModelStateHandler,
                    OptimizerStateHandler, LRSchedulerStateHandler, SamplerStateHandler,
                    get_handler_registry, set_handler_registry)

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "LRSchedulerStateHandler", "SamplerStateHandler", "get_handler_registry",
           "set_handler_registry", "HorovodInternalError", "HostsUpdatedInterrupt"]


def _reset():
    _kolo.shutdown()
    _kolo.init()


def run(func):
    """Decorates `func(state, ...)` so that it survives membership changes:
    it is called again after every reset, with the state restored (after a
    failure) or kept (after a host update), until it returns."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                    _report.recovery_restored()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                _report.recovery_told()
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            _reset()
            _report.recovery_formed()
            state.on_reset()
    return wrapper

