"""Deployed adapter at paper scale: model size, log/register time, load and predict latency.

    python benchmarks/bench_deploy.py                 # 64,896-d, M = 80, K = 2, N = 200
    python benchmarks/bench_deploy.py --dim 4096      # smaller, quicker

Fits MMDTL2 (linear, ``l2_zscore``, paper parameters) on synthetic features of the paper's
conv3 dimension with M labelled target samples and N source samples, logs and registers
it in a temporary SQLite MLflow store exactly as ``mmdtl2 register`` does
(:func:`mmdtl2_dist.deploy.pyfunc.log_adapter`), and measures:

- the logged model's size on disk, by file (the npz holds X_train (M, L), P, b and the
  z-score statistics; the input example is one raw row in JSON, twice);
- fit, log + register, and ``mlflow.pyfunc.load_model("models:/NAME@ALIAS")`` times;
- predict latency of the loaded pyfunc (schema check + scoring + output table) and of
  the in-process estimator's ``predict``, for 1 and 100 samples (median of repeats), and
  that labels and per-class scores agree exactly (the estimator's per-class scores are
  ``adapter_.decision_function``; its own ``decision_function`` is 1-D for two classes).

Prints a table and writes ``benchmarks/results/deploy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def median_time(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=64_896)
    ap.add_argument("--m", type=int, default=80, help="labelled target samples")
    ap.add_argument("--n-source", type=int, default=200)
    ap.add_argument("--classes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "deploy.json"))
    args = ap.parse_args()

    import mlflow
    from mlflow.tracking import MlflowClient

    from mmdtl2_dist.deploy.pyfunc import log_adapter
    from mmdtl2_dist.deploy.registry import use_tracking_uri
    from mmdtl2_dist.estimators import MMDTL2

    L, M, N, K = args.dim, args.m, args.n_source, args.classes
    rng = np.random.default_rng(0)
    # ReLU-like non-negative features with class-dependent means and a device shift
    mu = np.abs(rng.normal(size=(K, L)))
    ys, yt = np.arange(N) % K, np.arange(M) % K
    Xs = np.maximum(mu[ys] + rng.normal(size=(N, L)), 0)
    Xt = np.maximum(1.3 * mu[yt] + rng.normal(size=(M, L)) + 0.2, 0)
    Xq = np.maximum(1.3 * mu[rng.integers(0, K, 100)] + rng.normal(size=(100, L)) + 0.2, 0)

    t0 = time.perf_counter()
    est = MMDTL2(preprocessing="l2_zscore").fit_domains(Xs, ys, Xt, yt)
    fit_s = time.perf_counter() - t0

    res: dict = {"dim": L, "M": M, "N_source": N, "K": K, "fit_s": fit_s}
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        exp = client.create_experiment("bench", artifact_location=Path(tmp, "art").as_uri())
        with use_tracking_uri(uri):
            t0 = time.perf_counter()
            with mlflow.start_run(experiment_id=exp):
                info = log_adapter(
                    est.adapter_,
                    class_names=[f"class{k}" for k in range(K)],
                    input_example=Xt[:1],
                )
            mv = mlflow.register_model(info.model_uri, "bench-adapter")
            client.set_registered_model_alias("bench-adapter", "champion", mv.version)
            res["log_register_s"] = time.perf_counter() - t0
            model_dir = Path(tmp, "art").rglob("MLmodel").__next__().parent
            files = {
                str(p.relative_to(model_dir)): p.stat().st_size
                for p in model_dir.rglob("*")
                if p.is_file()
            }
            res["model_bytes"] = sum(files.values())
            res["files_bytes"] = dict(sorted(files.items(), key=lambda kv: -kv[1]))
            t0 = time.perf_counter()
            model = mlflow.pyfunc.load_model("models:/bench-adapter@champion")
            res["load_s"] = time.perf_counter() - t0
        for n in (1, 100):
            X = Xq[:n]
            res[f"pyfunc_predict_{n}_s"] = median_time(lambda X=X: model.predict(X), args.repeats)
            res[f"estimator_predict_{n}_s"] = median_time(lambda X=X: est.predict(X), args.repeats)
        out = model.predict(Xq)
        scores = out[[f"score_class{k}" for k in range(K)]].to_numpy()
        res["exact_match"] = bool(
            np.array_equal(scores, est.adapter_.decision_function(Xq))
            and np.array_equal(out["label"].to_numpy(), est.predict(Xq))
        )
    res["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"

    print(f"MMDTL2 adapter, L = {L:,}, M = {M}, K = {K}, N = {N}")
    print(f"  fit                   {fit_s:8.2f} s")
    print(f"  log + register        {res['log_register_s']:8.2f} s")
    print(f"  model size            {res['model_bytes'] / 1e6:8.2f} MB")
    for f, b in list(res["files_bytes"].items())[:5]:
        print(f"    {f:38s} {b / 1e6:8.3f} MB")
    print(f"  load (models:/@alias) {res['load_s']:8.2f} s")
    for n in (1, 100):
        print(
            f"  predict {n:3d}: pyfunc {1e3 * res[f'pyfunc_predict_{n}_s']:8.1f} ms, "
            f"estimator {1e3 * res[f'estimator_predict_{n}_s']:8.1f} ms"
        )
    print(f"  registry == estimator exactly: {res['exact_match']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
