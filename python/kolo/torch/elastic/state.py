"""The state elastic training keeps: horovod.torch.elastic.state's
TorchState and its handlers, Horovod's ObjectState, and what kolo adds:
the committed state shipped durably to the coordinator (see the package's
docstring)."""
import copy
import io
import os
import threading

import torch

import kolo as _kolo
from kolo import _report
from kolo.exceptions import HostsUpdatedInterrupt

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler

# Horovod's HostUpdateResult
_NO_UPDATE, _REMOVED, _ADDED, _MIXED = 0, 1, 2, 3


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


class _Kept:
    """What a State and a StateHandler both do: save() what is there now,
    restore() what was saved, sync() every rank to rank 0's."""

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()


class State(_Kept):
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

    def reset(self):
        pass


class ObjectState(State):
    """State made of plain attributes given as keyword arguments (epoch=0,
    batch=0, ...), readable and writable as attributes. As Horovod's, it
    keeps references, not copies: save() records the attributes' current
    objects, restore() puts those objects back (a list changed in place
    since the commit stays changed), sync() gives every rank rank 0's."""

    def __init__(self, bcast_object=broadcast_object, get_rank=None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = dict(kwargs)
        self._set_attrs()

    def save(self):
        self._saved_state = {k: getattr(self, k) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0,
                                                   name="kolo.elastic.object_state")
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


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

    def __setattr__(self, name, value):
        # Horovod's: a new model (optimizer, ...) for a handled attribute
        # becomes the handler's value, and is saved at once
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()
        self._fresh = False
        self._commits += 1
        if _durable() and _kolo.rank() == 0:
            # The handlers' saved copies are replaced, never changed, by the
            # next save(), and the plain attributes are copied here: the
            # shipping thread serializes them while training goes on.
            saved = ({k: h.saved for k, h in self._handlers.items() if h.saved is not None},
                     _copies(self._saved_state))
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
            if k in self._handlers and self._handlers[k].saved is not None:
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


def _copies(attrs):
    """Deep copies of the attributes that can be copied (one that cannot is
    not shipped; it stays in memory as Horovod keeps it)."""
    out = {}
    for k, v in attrs.items():
        try:
            out[k] = copy.deepcopy(v)
        except Exception:  # noqa: BLE001 - e.g. a lock or a file among them
            pass
    return out


# ---------------------------------------------------------------- handlers

class StateHandler(_Kept):
    """Keeps one attribute of a TorchState whose type it knows (Horovod's
    interface, for handlers of one's own: get_handler_registry /
    set_handler_registry): save() keeps the value's state, restore() loads
    it back, sync() gives every rank rank 0's. `saved` is what kolo ships
    durably with a commit (None: nothing)."""
    saved = None

    def __init__(self, value):
        self.value = value

    def set_value(self, value):
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with state_dict()/load_state_dict(): its state is a deep copy
    of its state dict; sync() broadcasts rank 0's (as `sync_name`)."""
    sync_name = "kolo.elastic.state_dict"

    def __init__(self, value):
        super().__init__(value)
        self.saved = copy.deepcopy(value.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0,
                                                    name=self.sync_name))


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class LRSchedulerStateHandler(_StateDictHandler):
    sync_name = "kolo.elastic.lr_scheduler"


class SamplerStateHandler(_StateDictHandler):
    sync_name = "kolo.elastic.sampler"


# torch 2 names the schedulers' base LRScheduler (_LRScheduler is a
# subclass of it left for old code); torch 1.13 has _LRScheduler only
_LR_BASE = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or \
    torch.optim.lr_scheduler._LRScheduler

_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_LR_BASE, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs TorchState looks its keyword
    arguments up in, first match first."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _handler_for(v):
    for kind, cls in _handler_registry:
        if isinstance(v, kind):
            return cls(v)
    return None
