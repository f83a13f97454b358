"""kolo.tune keeps a study's files to its user (issue 28): under a umask
of 022, the study's directory and every directory in it are 0700, and the
study database (with whatever journal SQLite left), the trial logs and
the local cluster's files are 0600, for a new study and for one resumed
from a database an older kolo left 0644."""
import os
import stat
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kolo.tune  # noqa: E402

pytest.importorskip("optuna")
if os.environ.get("KOLO"):
    os.environ.setdefault("KOLO_BIN", os.environ["KOLO"])

TRIAL = r'''
import sys
sys.path.insert(0, sys.argv[2])
import kolo
kolo.init()
print("trial output x=%s" % sys.argv[1], flush=True)
kolo.report_epoch(0, metrics={"loss": float(sys.argv[1])})
kolo.shutdown()
'''


def modes(directory):
    """(path, mode) of the directory and everything under it."""
    out = [(directory, stat.S_IMODE(os.lstat(directory).st_mode))]
    for top, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = os.path.join(top, name)
            out.append((p, stat.S_IMODE(os.lstat(p).st_mode)))
    return out


def open_to_others(directory):
    return ["%s %o" % (p, m) for p, m in modes(directory) if m & 0o077]


def search(script, d, trials, resume=False):
    return kolo.tune.run(["/usr/bin/python3", str(script), "{x}", os.path.join(ROOT, "python")],
                         {"x": ("uniform", 0.0, 1.0)}, trials, np=1, max_concurrent=1,
                         metric="loss", mode="min", sampler="random", pruner="none", seed=1,
                         directory=d, study_name="modes", resume=resume, verbose=False)


def test_study_files_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        script = tmp_path / "trial.py"
        script.write_text(TRIAL)
        d = str(tmp_path / "study")
        res = search(script, d, 1)
        assert [t["state"] for t in res["trials"]] == ["complete"], res
        found = dict(modes(d))
        assert found[d] == 0o700
        assert found[os.path.join(d, "study.db")] == 0o600
        logs = os.path.join(d, "logs")
        assert found[logs] == 0o700
        log = os.path.join(logs, "trial-0.log")
        assert found[log] == 0o600
        with open(log) as f:
            assert "trial output" in f.read()
        assert not open_to_others(d), open_to_others(d)

        # a study an older kolo left readable: resuming it makes it private
        for p, m in modes(d):
            os.chmod(p, 0o755 if stat.S_ISDIR(os.lstat(p).st_mode) else 0o644)
        res = search(script, d, 2, resume=True)
        assert len(res["trials"]) == 2, res
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(d, "study.db")).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.join(d, "logs", "trial-1.log")).st_mode) == 0o600
    finally:
        os.umask(old)
