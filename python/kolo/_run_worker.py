"""The worker side of kolo.run (kolo/_run.py): python3 -m kolo._run_worker DIR.

Loads the pickled (fn, args, kwargs) from $KOLO_RUN_PAYLOAD or DIR, runs
it, and prints the result as one marked line on stdout (which kolo run
streams to the caller from any host); an exception is printed pickled,
with its traceback, and the worker exits 1 so the job fails as Horovod's
would. A result that cannot be pickled is an error named as such."""
import base64
import os
import sys
import traceback

from kolo._run import ERROR_MARK, KEY_ENV, RESULT_MARK, seal_line

_KEY = os.environ.pop(KEY_ENV, "")


def _load(directory):
    import cloudpickle
    data = os.environ.pop("KOLO_RUN_PAYLOAD", None)
    if data is not None:
        return cloudpickle.loads(base64.b64decode(data))
    with open(os.path.join(directory, "payload.pkl"), "rb") as f:
        return cloudpickle.loads(f.read())


def _emit(mark, blob):
    sys.stdout.flush()
    sys.stdout.write(seal_line(_KEY, mark, blob) + "\n")
    sys.stdout.flush()


def main():
    import cloudpickle
    fn, args, kwargs = _load(sys.argv[1])
    try:
        result = fn(*args, **kwargs)
        blob = cloudpickle.dumps(result)
    except BaseException as e:  # noqa: B902 - every failure goes back to the caller
        tb = traceback.format_exc()
        try:
            err = cloudpickle.dumps((e, tb))
        except Exception:
            err = cloudpickle.dumps(("%s: %s" % (type(e).__name__, e), tb))
        _emit(ERROR_MARK, err)
        return 1
    _emit(RESULT_MARK, blob)
    return 0


if __name__ == "__main__":
    sys.exit(main())
