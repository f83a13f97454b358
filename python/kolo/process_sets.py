"""Process sets (Horovod's hvd.ProcessSet): some of the job's ranks running
collectives among themselves.

Each set is an engine of its own (python/kolo/_engine.py): a libkolo
context made by kolo_process_set_init, with its own negotiation (names are
per set) and data plane among its members. Every rank registers the same
sets in the same order - at init(process_sets=[...]), or with
add_process_set() when dynamic process sets are on (init(process_sets=
"dynamic") or HOROVOD_DYNAMIC_PROCESS_SETS=1) - and gets the same ids; a
rank outside a set registers it too but joins nothing. Ids are never reused
in a process, so a set added after a re-init gets a new one.
"""
import itertools
import os
import threading

from . import _engine

_lock = threading.RLock()
# id -> the registered sets besides the global one: the ProcessSet that
# made it first (it holds the engine), then any equal set that init() met
# later and gave the same id (Horovod's update_process_sets)
_sets = {}
_global_equals = []          # sets init() met that equal the global one (id 0)
_ids = itertools.count(1)
_dynamic = False


class ProcessSet:
    """A set of job ranks. `ranks` is sorted; `process_set_id` is None until
    the set is registered (0 for the global set)."""

    def __init__(self, ranks_or_comm=None):
        self.process_set_id = None
        self.ranks = None
        self._engine = None
        if ranks_or_comm is not None:
            try:
                ranks = [int(r) for r in ranks_or_comm]
            except (TypeError, ValueError):
                raise ValueError("a process set is made from a list of ranks, not %r"
                                 % (ranks_or_comm,))
            if len(set(ranks)) != len(ranks):
                raise ValueError("a process set lists every rank once: %s" % (ranks,))
            self.ranks = sorted(ranks)

    def size(self):
        """How many ranks the set has (None before it is registered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, -1 outside it (None before it
        is registered)."""
        if self.process_set_id is None:
            return None
        me = _engine_rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        """Whether this process belongs to the set (None before it is
        registered)."""
        if self.process_set_id is None:
            return None
        return _engine_rank() in self.ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __str__ = __repr__


global_process_set = ProcessSet()


def _global():
    import kolo
    return kolo._eng()


def _engine_rank():
    return _global().topology()[0]


def setup(process_sets):
    """After the job's engine joined (kolo.init): the global set, then the
    sets given to init(process_sets=...)."""
    global _dynamic
    eng = _global()
    size = eng.topology()[1]
    with _lock:
        global_process_set.ranks = list(range(size))
        global_process_set.process_set_id = 0
        global_process_set._engine = eng
        _dynamic = (process_sets == "dynamic" or
                    os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0"))
    if process_sets in (None, "dynamic"):
        return
    for ps in process_sets:
        _register(ps if isinstance(ps, ProcessSet) else ProcessSet(ps), equal_ok=True)


def teardown():
    """Before the job's engine shuts down: every set's engine goes."""
    with _lock:
        groups = list(_sets.values())
        _sets.clear()
        equals = list(_global_equals)
        _global_equals.clear()
    for group in groups:
        if group[0]._engine is not None:
            group[0]._engine.shutdown()
        for ps in group:
            ps._engine = None
            ps.process_set_id = None
    for ps in equals:
        ps._engine = None
        ps.process_set_id = None
    global_process_set._engine = None


def _same_id(ps, registered):
    """ps stands for registered from now on."""
    ps.process_set_id = registered.process_set_id
    ps.ranks = list(registered.ranks)
    ps._engine = registered._engine


def _register(ps, equal_ok=False):
    """Registers ps. equal_ok (init's sets): a set with the ranks of one
    registered already, the global one included, is not made again but
    gets its id, as Horovod's init() treats repeats; otherwise (an
    add_process_set) it is Horovod's error for an existing set."""
    size = _global().topology()[1]
    if ps.ranks is None or not ps.ranks:
        raise ValueError("a process set needs at least one rank")
    bad = [r for r in ps.ranks if r < 0 or r >= size]
    if bad:
        raise ValueError("process set ranks %s are not ranks of this job of %d" % (bad, size))
    if ps.process_set_id is not None:
        raise ValueError("%s has been added already" % (ps,))
    with _lock:
        same = [g[0] for g in _sets.values() if g[0].ranks == ps.ranks]
        if global_process_set.ranks == ps.ranks:
            same.append(global_process_set)
        if same and equal_ok:
            _same_id(ps, same[0])
            (_sets[ps.process_set_id] if ps.process_set_id else _global_equals).append(ps)
            return ps
        if same:
            raise ValueError("a process set with ranks %s exists already (id %d)"
                             % (ps.ranks, same[0].process_set_id))
        sid = next(_ids)
    eng = _engine.Engine()
    member = eng.init_set(_global(), sid, ps.ranks)
    with _lock:
        ps.process_set_id = sid
        ps._engine = eng if member else None
        _sets[sid] = [ps]
    return ps


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) on this
    rank; every rank must add the same sets in the same order. Members
    return once every member joined it."""
    if not _global().initialized():
        raise _engine.not_initialized()
    if not _dynamic:
        raise ValueError("process sets can be added after init() only with dynamic process "
                         "sets: init(process_sets=\"dynamic\") or HOROVOD_DYNAMIC_PROCESS_SETS=1")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    return _register(ps)


def remove_process_set(process_set):
    """Removes a registered set on this rank (members leave it: their
    pending operations on it fail), and every equal set init() gave its
    id: each is left without id and ranks, as Horovod invalidates them.
    True if it was registered; False for the global set, which stays."""
    if process_set is global_process_set or process_set.process_set_id == 0:
        return False
    if not _global().initialized():
        raise _engine.not_initialized()
    if not _dynamic:
        raise ValueError("process sets can be removed only with dynamic process sets: "
                         "init(process_sets=\"dynamic\") or HOROVOD_DYNAMIC_PROCESS_SETS=1")
    with _lock:
        group = _sets.get(process_set.process_set_id)
        if not group or not any(q is process_set for q in group):
            return False
        del _sets[process_set.process_set_id]
    if group[0]._engine is not None:
        group[0]._engine.shutdown()
    for ps in group:
        ps._engine = None
        ps.process_set_id = None
        ps.ranks = None
    return True


def engine_for(process_set, what="collective"):
    """The engine that runs `what` on process_set for this rank; Horovod's
    errors for a set that is not registered or does not include it."""
    ps = global_process_set if process_set is None else process_set
    if ps is global_process_set:
        return _global()
    if not isinstance(ps, ProcessSet):
        raise ValueError("process_set must be a ProcessSet, not %r" % (ps,))
    if ps.process_set_id == 0 and any(q is ps for q in _global_equals):
        return _global()
    if ps.process_set_id is None or not any(q is ps for q in _sets.get(ps.process_set_id, ())):
        raise ValueError("%s: %s has not been added (hvd.add_process_set or "
                         "init(process_sets=...))" % (what, ps))
    if ps._engine is None:
        raise ValueError("%s: rank %d is not a part of process set %d"
                         % (what, _engine_rank(), ps.process_set_id))
    return ps._engine
