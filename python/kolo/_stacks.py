"""`kolo stacks`: this worker's Python stacks, on demand, at no cost until
somebody asks.

The agent that started the worker hands it an anonymous file in append
mode (KOLO_STACKS_FD) and names a real-time signal (KOLO_STACKS_SIGNAL).
faulthandler, registered here for that signal, writes every thread's
stack to the file from the signal handler itself, in C: it answers while
the main thread is blocked inside a collective, spins in a loop or sleeps
in a data loader. The agent empties the file, sends the signal, reads
what came and sends it to the coordinator (agent/stacks.c). Outside a
kolo worker (no such variables), and with KOLO_TELEMETRY=0 (to measure
what it costs: bench/observability_overhead.sh), nothing is registered.
"""
import faulthandler
import os

_file = None


def register():
    """Registers the dump once per process; a no-op outside a kolo worker
    or when the agent's file is not there."""
    global _file
    if _file is not None:
        return
    if os.environ.get("KOLO_TELEMETRY", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    try:
        fd = int(os.environ["KOLO_STACKS_FD"])
        sig = int(os.environ["KOLO_STACKS_SIGNAL"])
        os.fstat(fd)
    except (KeyError, ValueError, OSError):
        return
    try:
        os.set_inheritable(fd, False)  # the worker's own programs do not get it
        f = os.fdopen(fd, "w", closefd=False)
        faulthandler.register(sig, file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
    _file = f
    # programs this worker starts do not inherit the file: nor the names
    os.environ.pop("KOLO_STACKS_FD", None)
    os.environ.pop("KOLO_STACKS_SIGNAL", None)
