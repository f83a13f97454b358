"""Epoch and step reports for the coordinator's dashboard (issue 6).

    hvd.report_epoch(epoch, samples=n, metrics={"loss": loss})

Call it once at the END of every epoch, on every rank. The epoch's start
on this rank is taken as the end of the previous report_epoch() call, or,
for the first one after kolo.init() (also after an elastic reset, which
re-initialises), as the moment init() returned. `samples` is what this
rank processed in the epoch (the coordinator sums the ranks' samples and
divides by the epoch's wall time: the first rank's start to the last
rank's end); `metrics` is a dict of JSON values (numbers for loss,
accuracy, ...), at most 4 KiB as JSON. The coordinator shows rank 0's
metrics and the mean over the ranks of every number
(GET /api/v1/jobs/{id}/epochs), and `kolo run` prints one line per epoch.

The call never blocks training: libkolo queues the report and a
background thread sends it (kolo_report_epoch_span in include/kolo.h).
Without a coordinator (a program started alone, solo mode) libkolo
accepts the report and drops it. DistributedOptimizer.step() reports each step's time itself (the
time since the previous step() on this rank): see report_step().
"""
import json
import math
import time

_mark_ms = None  # wall-clock ms of the previous epoch end, or of init()


def mark_init():
    """Called by kolo.init(): the first epoch starts now."""
    global _mark_ms
    _mark_ms = int(time.time() * 1000)


def report_epoch(epoch, samples=None, metrics=None):
    """Reports that epoch `epoch` (an int >= 0) ended now on this rank."""
    global _mark_ms
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError("report_epoch: epoch must be an int >= 0, not %r" % (epoch,))
    if samples is None:
        samples = 0
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError("report_epoch: samples must be an int >= 0, not %r" % (samples,))
    text = None
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise ValueError("report_epoch: metrics must be a dict, not %s"
                             % type(metrics).__name__)
        clean = {}
        for k, v in metrics.items():
            if hasattr(v, "item"):  # torch / numpy scalars
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            clean[str(k)] = v
        text = json.dumps(clean, separators=(",", ":"))
        if len(text) > 4096:
            raise ValueError("report_epoch: metrics are %d bytes as JSON; at most 4096"
                             % len(text))
    import kolo
    eng = kolo._eng()
    if not eng.initialized():
        raise kolo._engine.not_initialized()
    end = int(time.time() * 1000)
    start = _mark_ms if _mark_ms and _mark_ms <= end else 0
    _mark_ms = end
    rc, detail = 0, None
    with eng.borrow() as (lib, ctx):
        rc = lib.kolo_report_epoch_span(ctx, epoch, start, end, samples,
                                        text.encode() if text else None)
        if rc in (1, 8):
            detail = lib.kolo_last_error(ctx)
    if rc in (1, 8):  # KOLO_EINVAL, KOLO_ETOOBIG: the caller's mistake
        raise ValueError("report_epoch: %s" % (detail.decode(errors="replace") if detail else rc))
    # KOLO_EBUSY (queue full, dropped) and others: telemetry, never fatal


def report_step(seconds):
    """Records that one training step took `seconds` on this rank (cheap:
    steps are aggregated per second in libkolo). No-op without a
    coordinator."""
    import kolo
    eng = kolo._eng()
    if eng._ctx is None:  # not initialized: nothing to report to
        return
    with eng.borrow() as (lib, ctx):
        lib.kolo_report_step(ctx, float(seconds))


# An elastic recovery in progress (issue 32): monotonic times of the
# failed collective (told), the new generation's init (formed) and the
# state's sync (restored); reported at the first step after it.
_recovery = None


def recovery_told():
    """A collective failed: kolo.torch.elastic.run resets."""
    global _recovery
    _recovery = [time.monotonic(), None, None]


def recovery_formed():
    """The new generation's init returned."""
    if _recovery is not None and _recovery[1] is None:
        _recovery[1] = time.monotonic()


def recovery_restored():
    """The state was synced from rank 0 after the reset."""
    if _recovery is not None and _recovery[1] is not None and _recovery[2] is None:
        _recovery[2] = time.monotonic()


def recovery_step_done():
    """A training step (an optimizer step or a commit) ended: the first
    after a recovery sends its three durations (kolo_report_recovery)."""
    global _recovery
    rec = _recovery
    if rec is None or rec[2] is None:
        return
    _recovery = None
    now = time.monotonic()
    ms = [max(0, int(round(1000 * d))) for d in (rec[1] - rec[0], rec[2] - rec[1], now - rec[2])]
    try:
        import kolo
        eng = kolo._eng()
        if eng._ctx is None:
            return
        with eng.borrow() as (lib, ctx):
            lib.kolo_report_recovery(ctx, *[min(m, 0xFFFFFFFF) for m in ms])
    except Exception:  # telemetry must never break a training step
        pass


class StepTimer:
    """Reports the time between consecutive tick() calls (the optimizer's
    step()); the first tick only starts the clock."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = None

    def tick(self):
        now = time.perf_counter()
        last, self._last = self._last, now
        if last is None:
            return
        try:
            report_step(now - last)
        except Exception:  # telemetry must never break a training step
            pass
