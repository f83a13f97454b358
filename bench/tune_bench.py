"""kolo tune against the same trials one after another without pruning
(issue 18's benchmark): wall time until the best configuration was found
and the epochs run, on the digits MLP (examples/pytorch/digits.py).

Both searches use the same sampler seed: "sequential" runs them one at a
time with no pruner (what a for loop over configurations does), "kolo
tune" runs MAX_CONCURRENT at once on the same slots with the pruner.

  /usr/bin/python3 bench/tune_bench.py [--trials 12] [--np 2] [--epochs 8] [--out FILE]
"""
import argparse
import os
import sys
import tempfile
import shutil
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("KOLO_BIN", os.path.join(ROOT, "build", "bin", "kolo"))
import kolo.tune  # noqa: E402

SPACE = {"lr": ("log", 1e-3, 0.3), "batch": [16, 32, 64], "hidden": [16, 32, 64, 128]}


def search(work, name, trials, np_, epochs, concurrent, pruner, seed):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "examples", "pytorch", "digits.py"),
           "--epochs", str(epochs), "--lr", "{lr}", "--batch-size", "{batch}", "--hidden",
           "{hidden}"]
    t0 = time.monotonic()
    res = kolo.tune.run(cmd, SPACE, trials, np=np_, max_concurrent=concurrent,
                        slots=np_ * 2, metric="accuracy", mode="max", pruner=pruner,
                        seed=seed, study_name=name, directory=os.path.join(work, name),
                        verbose=False)
    wall = time.monotonic() - t0
    best = [t for t in res["trials"] if t["number"] == res["best_trial"]][0]
    return {"wall_s": wall, "best_value": res["best_value"], "best_at_s": best["ended_s"],
            "epochs": sum(t["epochs"] for t in res["trials"]),
            "pruned": sum(t["state"] == "pruned" for t in res["trials"]),
            "best_params": res["best_params"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--pruner", default="median")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kolo-tunebench.")
    try:
        seq = search(work, "sequential", a.trials, a.np, a.epochs, 1, "none", a.seed)
        tune = search(work, "tune", a.trials, a.np, a.epochs, a.concurrent, a.pruner, a.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [("sequential, no pruning", seq), ("kolo tune (%d at once, %s pruner)"
                                               % (a.concurrent, a.pruner), tune)]
    text = ["| search | wall s | best found at s | best accuracy | epochs run | pruned |",
            "|---|---:|---:|---:|---:|---:|"]
    for label, r in rows:
        text.append("| %s | %.1f | %.1f | %.4f | %d | %d |" % (
            label, r["wall_s"], r["best_at_s"], r["best_value"], r["epochs"], r["pruned"]))
    text.append("")
    text.append("kolo tune / sequential: wall %.2fx, time to the best %.2fx, epochs %.2fx "
                "(%d saved)" % (tune["wall_s"] / seq["wall_s"], tune["best_at_s"] /
                                seq["best_at_s"], tune["epochs"] / seq["epochs"],
                                seq["epochs"] - tune["epochs"]))
    print("\n".join(text))
    if a.out:
        with open(a.out, "w") as f:
            f.write("# kolo tune against sequential trials (%s)\n\n" %
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            f.write("`/usr/bin/python3 bench/tune_bench.py --trials %d --np %d --epochs %d` on "
                    "this 2-vCPU VM: the digits MLP, %d trials of %d workers, the same TPE "
                    "seed (%d) in both; %d slots.\n\n" % (a.trials, a.np, a.epochs, a.trials,
                                                          a.np, a.seed, a.np * 2))
            f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
