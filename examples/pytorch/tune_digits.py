#!/usr/bin/python3
"""Hyperparameter search on the 8x8 digits with kolo.tune.

    /usr/bin/python3 examples/pytorch/tune_digits.py --trials 12 --np 2 --max-concurrent 2

Each trial is a 2-worker kolo job running examples/pytorch/digits.py with
the sampled learning rate, batch size and hidden width; digits.py reports
every epoch's loss and test accuracy (hvd.report_epoch), which Optuna's
pruner (ASHA by default) uses to stop poor trials early. A local
coordinator and agent are started for the search (np x max_concurrent
slots); the study is kept in SQLite under --dir, so a search that was
interrupted continues with --resume. The same search from the shell:

    kolo tune --trials 12 --np 2 --max-concurrent 2 --space space.yaml \\
        --metric accuracy --mode max -- /usr/bin/python3 examples/pytorch/digits.py \\
        --epochs 8 --lr {lr} --batch-size {batch} --hidden {hidden}
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import kolo.tune
except ImportError:  # a checkout without PYTHONPATH: the package next door
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import kolo.tune

SPACE = {"lr": ("log", 1e-3, 0.3), "batch": [16, 32, 64], "hidden": [16, 32, 64, 128]}


def main():
    p = argparse.ArgumentParser(description="kolo.tune on the digits MLP")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--max-concurrent", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--pruner", default="asha", choices=kolo.tune.PRUNERS)
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--study", default=None)
    p.add_argument("--dir", default=None, help="the study's directory")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--json", action="store_true", help="end with the result as one JSON line")
    a = p.parse_args()
    cmd = ["/usr/bin/python3", os.path.join(HERE, "digits.py"), "--epochs", str(a.epochs),
           "--lr", "{lr}", "--batch-size", "{batch}", "--hidden", "{hidden}"]
    result = kolo.tune.run(cmd, SPACE, a.trials, np=a.np, max_concurrent=a.max_concurrent,
                           metric="accuracy", mode="max", pruner=a.pruner, seed=a.seed,
                           study_name=a.study, directory=a.dir, resume=a.resume)
    pruned = sum(t["state"] == "pruned" for t in result["trials"])
    print("best: trial %s, accuracy %.4f with %s; %d trial(s), %d pruned, %.1f s" % (
        result["best_trial"], result["best_value"] or 0.0, result["best_params"],
        len(result["trials"]), pruned, result["seconds"]))
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
