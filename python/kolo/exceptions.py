"""The exceptions kolo raises, named as Horovod names them so that
`except hvd.HorovodInternalError` in existing scripts keeps working."""


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank: a peer died, the ranks disagreed
    (mismatched shapes, dtypes, ops), the job is shutting down. In elastic
    training the state is restored from the last commit and the ring is
    rebuilt."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; raised at the next commit or host-update
    check so that elastic training re-forms the ring without a rollback.
    `skip_sync` is True when the new workers need no state broadcast."""

    def __init__(self, skip_sync=False):
        super().__init__("the set of hosts changed")
        self.skip_sync = skip_sync


KoloError = HorovodInternalError


# ---------------------------------------------------------------- tracebacks

_KOLO_DIR = __file__.rsplit("/", 1)[0] + "/"


def _user_frames(tb):
    """tb without the frames of kolo's own package (at least the last frame
    kept): what a user reads of a HorovodInternalError is where their
    script called the collective, not kolo's plumbing beneath it."""
    import types
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    kept = [t for t in frames if not t.tb_frame.f_code.co_filename.startswith(_KOLO_DIR)]
    if not kept:
        kept = frames[-1:]
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out, len(frames) - len(kept)


def install_excepthook():
    """A HorovodInternalError that ends the program (a consequence of
    another rank's failure, or the ranks' disagreement) is printed with the
    user's frames only, and a note on what was left out; every other
    exception as before. KOLO_FULL_TRACEBACK=1 keeps kolo's frames."""
    import os
    import sys
    if os.environ.get("KOLO_FULL_TRACEBACK") == "1" or getattr(sys.excepthook, "_kolo", False):
        return
    prev = sys.excepthook

    def hook(etype, value, tb):
        if isinstance(value, HorovodInternalError) and tb is not None:
            tb, dropped = _user_frames(tb)
            value = value.with_traceback(tb)  # what Python's printer reads
            if dropped and hasattr(value, "add_note"):
                value.add_note("(%d frame(s) inside kolo left out; KOLO_FULL_TRACEBACK=1 shows "
                               "them)" % dropped)
        prev(etype, value, tb)

    hook._kolo = True
    sys.excepthook = hook
