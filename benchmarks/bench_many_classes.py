"""``MMDTL2(select="auto")`` with many classes: time and peak memory of one fit.

    python benchmarks/bench_many_classes.py [--classes 10 20 40 65] [--per-class 40]
        [--dim 2048] [--labels 3] [--noise 8] [--baselines] [--seeds 0]
        [--out benchmarks/results/many_classes.json]

The W-step's dual has one variable per (class, labelled target) pair, so its Hessian
has ``(K M)²`` entries: with 65 classes (Office-Home) and 3 labelled targets per class,
which the rule's self-training grows to 9, ``K M = 38,025``. Each fit runs in a fresh
process (its peak resident memory is the process's own), on synthetic CNN-like features:
``per-class`` source and target samples of every class (non-negative, class means plus
``noise`` times Gaussian noise, the target domain shifted; at the default 8 the fit is
about 85 % accurate and the rule doubles its pseudo-labels on this hard shift, the
largest W-step it makes), ``labels`` labelled targets per class, the other target
samples given as unlabelled, the estimator as a user calls it (``l2_zscore``).
``--baselines`` also fits, after the timed fit, the source SVM, the target SVM and
MMDTL2 with the rule's candidate S fixed (identity prior, weight 1, ``c_f = 1``, no
self-training) on the same samples (the unlabelled targets in their statistics), and
reports their accuracy on the same held-out targets.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, resource, sys, time
import numpy as np
from mmdtl2_dist.estimators import MMDTL2
C, per, d, nl = (int(a) for a in sys.argv[1:5])
noise, baselines, seed = float(sys.argv[5]), sys.argv[6] == "1", int(sys.argv[7])
rng = np.random.default_rng(seed)
means = rng.normal(size=(C, d))
y = np.repeat(np.arange(C), per)
Xs = np.maximum(means[y] + noise * rng.normal(size=(len(y), d)), 0)
Xt = np.maximum(means[y] + noise * rng.normal(size=(len(y), d)) + rng.normal(size=d), 0)
lab = np.concatenate([np.flatnonzero(y == c)[:nl] for c in range(C)])
rest = np.setdiff1d(np.arange(len(y)), lab)
t0 = time.perf_counter()
m = MMDTL2(select="auto", preprocessing="l2_zscore").fit_domains(
    Xs, y, Xt[lab], y[lab], Xt_unlabelled=Xt[rest]
)
out = {"fit_s": time.perf_counter() - t0,
       "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
if baselines:
    from mmdtl2_dist.estimators import SourceSVM, TargetSVM
    others = {
        "source_svm": SourceSVM(preprocessing="l2_zscore"),
        "target_svm": TargetSVM(preprocessing="l2_zscore"),
        "identity_prior_no_self_training": MMDTL2(
            prior="identity", prior_weight=1.0, c_f=1.0, preprocessing="l2_zscore"),
    }
    for name, est in others.items():
        est.fit_domains(Xs, y, Xt[lab], y[lab], Xt_unlabelled=Xt[rest])
        out[name + "_accuracy"] = float(est.score(Xt[rest], y[rest]))
print(json.dumps({
    **out,
    "table": m.auto_["table"],
    "accuracy": float(m.score(Xt[rest], y[rest])),
    "pick": m.auto_["pick"],
    "pseudo_labelled": m.auto_["pseudo_labelled"],
    "pseudo_per_labelled": m.auto_["pseudo_per_labelled"],
}))
"""


def one_fit(
    classes: int,
    per_class: int,
    dim: int,
    labels: int,
    noise: float,
    baselines: bool = False,
    seed: int = 0,
) -> dict:
    """One fit in a fresh process; its figures, or why it failed (killed, error)."""
    t0 = time.perf_counter()
    argv = (classes, per_class, dim, labels, noise, int(baselines), seed)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, argv)], capture_output=True, text=True
    )
    out = {"classes": classes, "per_class": per_class, "dim": dim, "labels": labels,
           "noise": noise, "seed": seed}  # fmt: skip
    if proc.returncode:
        return {**out, "failed": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return {**out, **json.loads(proc.stdout.strip().splitlines()[-1]),
            "process_s": time.perf_counter() - t0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, nargs="+", default=[10, 20, 40, 65])
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--labels", type=int, default=3)
    ap.add_argument("--noise", type=float, default=8.0, help="within-class spread")
    ap.add_argument("--baselines", action="store_true", help="also the source and target SVMs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="the data's random seeds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = []
    for seed in args.seeds:
        for c in args.classes:
            runs.append(
                one_fit(c, args.per_class, args.dim, args.labels, args.noise, args.baselines, seed)
            )
            print(json.dumps(runs[-1]), flush=True)
    meta = {
        "command": "python benchmarks/bench_many_classes.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "load_after": list(__import__("os").getloadavg()),
        "peak_rss_of_this_process_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
