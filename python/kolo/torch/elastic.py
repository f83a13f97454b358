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
import copy
import functools
import io
import math
import os
import threading

import torch

import kolo as _kolo
from kolo import _report
from kolo.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt"]

# Horovod's HostUpdateResult
_NO_UPDATE, _REMOVED, _ADDED, _MIXED = 0, 1, 2, 3


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


class _HostMessages:
    """What Horovod keeps in `state._host_messages` (a queue.Queue of
    (timestamp, HostUpdateResult) notifications from its driver), read
    from kolo's coordinator: `empty()` is False once the coordinator
    announced a membership update this state has not acted on yet, until
    check_host_updates() (commit()) takes it. Horovod's own tests and
    examples wait on it (`while state._host_messages.empty(): sleep`);
    `put()` (on_hosts_updated) and `get()` work as on the queue."""

    def __init__(self, state):
        self._state = state
        self._items = []   # (timestamp, update) put by hand
        self._lock = threading.Lock()

    def _announced(self):
        """The coordinator's update newer than what the state acted on."""
        if not _kolo.is_initialized():
            return None
        stamp, kind = _kolo._eng().hosts_updated()
        if stamp and stamp > self._state._last_updated_timestamp:
            return stamp, kind
        return None

    def put(self, item, block=True, timeout=None):
        with self._lock:
            self._items.append(tuple(item))

    put_nowait = put

    def empty(self):
        with self._lock:
            if self._items:
                return False
        return self._announced() is None

    def qsize(self):
        with self._lock:
            n = len(self._items)
        return n + (self._announced() is not None)

    def get(self, block=True, timeout=None):
        import queue
        import time
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._items:
                    return self._items.pop(0)
            got = self._announced()
            if got is not None:
                return got
            if not block or (end is not None and time.monotonic() >= end):
                raise queue.Empty
            time.sleep(0.05)

    def get_nowait(self):
        return self.get(block=False)

    def drain(self):
        """Every notification put by hand, oldest first (the coordinator's
        are read by check_host_updates itself)."""
        with self._lock:
            items, self._items = self._items, []
        return items


class State:
    """The state elastic training keeps consistent across resets: save() /
    restore() the last commit, sync() it from rank 0, reset() after a
    membership change."""

    def __init__(self, bcast_object=broadcast_object, get_rank=None):
        self._bcast_object = bcast_object
        self._rank = get_rank or _kolo.rank
        self._reset_callbacks = []
        self._last_updated_timestamp = 0
        self._host_messages = _HostMessages(self)

    def register_reset_callbacks(self, callbacks):
        """Functions called with no argument after every reset, once the
        new generation is up and before the state is synchronised."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for cb in self._reset_callbacks:
            cb()

    def on_hosts_updated(self, timestamp, update_res):
        # Horovod's notification entry point (its driver calls it); kolo
        # learns updates from the coordinator, but a test or a tool may
        # still call it: the notification counts at the next commit
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Saves the state in memory (and, from rank 0, durably on the
        coordinator), then checks for host updates."""
        self.save()
        _report.recovery_step_done()  # the first commit after a reset ends its recovery
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the coordinator
        announced a membership update since the last check (or one was
        put in _host_messages). Rank 0's view is broadcast, so every rank
        decides the same."""
        prev = self._last_updated_timestamp
        last, kind = prev, _NO_UPDATE
        stamp, k = _kolo._eng().hosts_updated()
        if stamp > last:
            last, kind = stamp, k
        for stamp, k in self._host_messages.drain():  # Horovod's: newest, ORed
            if stamp > prev:
                last, kind = max(last, stamp), kind | k
        prev, last, kind = self._bcast_object((prev, last, kind), 0,
                                              name="kolo.elastic.host_updates")
        self._last_updated_timestamp = last
        if last > prev:
            raise HostsUpdatedInterrupt(kind == _REMOVED)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """State made of plain picklable attributes given as keyword arguments
    (epoch=0, batch=0, ...), readable and writable as attributes."""

    def __init__(self, bcast_object=broadcast_object, get_rank=None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = dict(kwargs)
        self._set_attrs()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0,
                                                   name="kolo.elastic.object_state")
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


# ---------------------------------------------------------------- durable commits

class _Shipper:
    """Ships the newest committed state to the coordinator on a background
    thread; a commit made while one is on its way replaces the queued one."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queued = None
        self._busy = False
        self._thread = None
        self.acked = 0          # id of the last acknowledged snapshot
        self.acked_bytes = 0
        self.acked_sha256 = None  # with KOLO_COMMIT_VERIFY=1 (tests, audits)
        self.errors = 0
        self.last_error = None

    def submit(self, blob, meta):
        """blob: bytes, or a function that makes them (called on the
        shipping thread, so serializing stays off the training thread)."""
        with self._cv:
            self._queued = (blob, meta)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kolo-commit",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def flush(self, timeout=60.0):
        """Waits until nothing is queued or on its way; True if so."""
        with self._cv:
            return self._cv.wait_for(lambda: self._queued is None and not self._busy, timeout)

    def _loop(self):
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: self._queued is not None, 30.0):
                    return
                blob, meta = self._queued
                self._queued = None
                self._busy = True
            retry = False
            try:
                if callable(blob):
                    blob = blob()
                from kolo import _snapshot
                sid = _snapshot.put(blob, meta)
                if os.environ.get("KOLO_COMMIT_VERIFY") == "1":
                    import hashlib
                    self.acked_sha256 = hashlib.sha256(blob).hexdigest()
                self.acked, self.acked_bytes = sid, len(blob)
                self.tries = 0
            except Exception as e:  # noqa: BLE001 - reported, training goes on
                self.errors += 1
                self.last_error = str(e)
                # A reset cancelled it or ended its generation: ship it again
                # from the next one, unless a newer commit came meanwhile.
                self.tries = getattr(self, "tries", 0) + 1
                retry = self.tries < 50 and any(
                    k in self.last_error for k in ("ESHUTDOWN", "ESTALE", "not been initialized",
                                                   "no coordinator context", "ECLOSED"))
            finally:
                with self._cv:
                    self._busy = False
                    if retry and self._queued is None:
                        self._queued = (blob, meta)
                    self._cv.notify_all()
            if retry:
                threading.Event().wait(0.2)


def _durable():
    return (os.environ.get("KOLO_DURABLE_COMMIT", "1") != "0"
            and os.environ.get("KOLO_COORDINATOR") is not None
            and os.environ.get("KOLO_ELASTIC") == "1")


class TorchState(ObjectState):
    """The state of a PyTorch training: a model, an optimizer, samplers,
    and plain attributes (epoch, batch, ...).

    commit() copies model.state_dict() and optimizer.state_dict() in
    memory; restore() loads them back; sync() broadcasts them from rank 0.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        self._handlers = {}
        plain = {}
        if model is not None:
            kwargs["model"] = model
        if optimizer is not None:
            kwargs["optimizer"] = optimizer
        for k, v in kwargs.items():
            h = _handler_for(v)
            if h is not None:
                self._handlers[k] = h
            else:
                plain[k] = v
        super().__init__(bcast_object=broadcast_object, get_rank=_kolo.rank, **plain)
        for k, h in self._handlers.items():
            setattr(self, k, h.value)
        self._shipper = _Shipper()
        self._ship = None          # (blob maker, meta) of a save() not shipped yet
        self._ship_later = False   # inside commit(): ship after the check
        self._fresh = True   # nothing committed or synced in this process yet
        self._commits = 0

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()
        self._fresh = False
        self._commits += 1
        if _durable() and _kolo.rank() == 0:
            # The saved copies are replaced, never changed, by the next
            # save(): the shipping thread may serialize these references.
            saved = ({k: h.saved for k, h in self._handlers.items()}, dict(self._saved_state))
            self._ship = (lambda: _serialize(*saved),
                          {"commit": self._commits, "attrs": _jsonable(self._saved_state)})
            if not self._ship_later:
                self._ship_now()

    def _ship_now(self):
        if self._ship is not None:
            self._shipper.submit(*self._ship)
            self._ship = None

    def commit(self):
        # The check for host updates is a collective every rank waits in:
        # the shipping thread (serializing under the GIL, hashing, sending)
        # starts once it is done, so rank 0 is not late for it.
        self._ship_later = True
        try:
            super().commit()
        finally:
            self._ship_later = False
            self._ship_now()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        if self._fresh and _durable() and _kolo.rank() == 0:
            self._load_latest_snapshot()
        self._fresh = False
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def flush(self, timeout=60.0):
        """Waits for the last commit's snapshot to be acknowledged (rank 0);
        returns its id, or 0 when none was shipped."""
        self._shipper.flush(timeout)
        return self._shipper.acked

    def durable_status(self):
        """What rank 0's commit shipping has done: the last acknowledged
        snapshot (id, bytes; sha256 with KOLO_COMMIT_VERIFY=1), failures."""
        s = self._shipper
        return {"acked_id": s.acked, "acked_bytes": s.acked_bytes, "acked_sha256": s.acked_sha256,
                "errors": s.errors, "last_error": s.last_error}

    def _load_latest_snapshot(self):
        from kolo import _snapshot
        got = _snapshot.get_latest()
        if got is None:
            return
        _sid, blob, _meta = got
        data = torch.load(io.BytesIO(blob))
        for k, saved in data.get("handlers", {}).items():
            if k in self._handlers:
                self._handlers[k].saved = saved
                self._handlers[k].restore()
        self._saved_state.update(data.get("attrs", {}))
        self._set_attrs()


def _serialize(handlers, attrs):
    buf = io.BytesIO()
    torch.save({"handlers": handlers, "attrs": attrs}, buf)
    return buf.getvalue()


def _jsonable(attrs):
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
    return out


class _ModelHandler:
    def __init__(self, model):
        self.value = model
        self.saved = copy.deepcopy(model.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler:
    def __init__(self, optimizer):
        self.value = optimizer
        self.saved = copy.deepcopy(optimizer.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler:
    def __init__(self, sampler):
        self.value = sampler
        self.saved = copy.deepcopy(sampler.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        state = broadcast_object(self.value.state_dict(), 0, name="kolo.elastic.sampler")
        self.value.load_state_dict(state)


def _handler_for(v):
    if isinstance(v, torch.nn.Module):
        return _ModelHandler(v)
    if isinstance(v, torch.optim.Optimizer):
        return _OptimizerHandler(v)
    if isinstance(v, ElasticSampler):
        return _SamplerHandler(v)
    return None


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the current ranks, and re-splits what is left
    of the epoch after a reset, so no sample is skipped or seen twice in an
    epoch (up to the padding that evens out the last batch).

    The order of an epoch is one permutation (seed + epoch) of the whole
    dataset; rank r takes positions r, r + n, r + 2n, ... of what remains.
    After k batches of b samples on each of n ranks, exactly the first
    k * b * n positions are done, which is what record_batch counts.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks one batch of batch_size samples per rank as done."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas = _kolo.size() if _kolo.is_initialized() else 1
        self.rank = _kolo.rank() if _kolo.is_initialized() else 0
        order = self._order()
        self.remaining_indices = order[min(self.processed_num, len(order)):]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def _order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def __iter__(self):
        idx = list(self.remaining_indices)
        if idx:
            while len(idx) < self.total_size:
                idx += idx[:self.total_size - len(idx)]
        return iter(idx[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
