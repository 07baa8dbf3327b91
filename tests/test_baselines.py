"""The skada baselines as their papers run them: transductive adapter, semi-supervised SVM."""

from __future__ import annotations

import numpy as np
import pytest

from mmdtl2_dist.study import baselines
from mmdtl2_dist.study.baselines import SA_FALLBACK_DIMENSION, SVM_C_FALLBACK, skada_predict

N_CLASSES = 3


def _shift(n_lab: int, seed: int = 0):
    """A small 3-class shift: source, target pool (``n_lab`` labelled per class), test."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=3.0, size=(N_CLASSES, 12))

    def draw(n_per_class, offset):
        y = np.repeat(np.arange(1, N_CLASSES + 1), n_per_class)
        return means[y - 1] + offset + rng.normal(size=(len(y), 12)), y

    Xs, ys = draw(15, 0.0)
    Xpool, ypool = draw(6, 1.5)
    Xq, yq = draw(10, 1.5)
    masked = np.full(len(ypool), -1)
    keep = np.concatenate([np.flatnonzero(ypool == c)[:n_lab] for c in range(1, N_CLASSES + 1)])
    masked[keep] = ypool[keep]
    return Xs, ys, Xpool, masked, Xq, yq


class _FitSpy:
    """Records every SVC.fit call's rows, labels and sample weights."""

    def __init__(self, monkeypatch):
        from sklearn.svm import SVC

        self.calls = []
        real = SVC.fit

        def fit(svc, X, y, sample_weight=None):
            self.calls.append((np.array(X), np.array(y), sample_weight))
            return real(svc, X, y, sample_weight=sample_weight)

        monkeypatch.setattr(SVC, "fit", fit)


@pytest.mark.parametrize("method", ["sa_svm", "kmm_svm", "coral_svm"])
def test_labelled_targets_reach_the_svm_and_test_samples_never_do(method, monkeypatch):
    Xs, ys, Xpool, masked, Xq, _ = _shift(n_lab=3)
    spy = _FitSpy(monkeypatch)
    y_pred, info = skada_predict(method, {}, Xs, ys, Xpool, masked, Xq)
    assert y_pred.shape == (len(Xq),) and info["n_labelled_target"] == 3 * N_CLASSES
    X_final, y_final, w_final = spy.calls[-1]
    yt = masked[masked != -1]
    # The final SVM: every source sample, then the labelled targets with their labels.
    assert len(y_final) == len(ys) + len(yt)
    np.testing.assert_array_equal(y_final[: len(ys)], ys)
    np.testing.assert_array_equal(np.sort(y_final[len(ys) :]), np.sort(yt))
    for _X, y, w in spy.calls:  # CV fits too: never a masked label, never more rows
        assert -1 not in y and len(y) <= len(ys) + len(yt)
        if method == "kmm_svm":
            assert len(w) == len(y) and np.all(w[len(ys) :] == 1.0)
    if method == "kmm_svm":  # KMM leaves the features as they are: each row with its label
        pairs = {
            (r.tobytes(), c) for r, c in zip(X_final[len(ys) :], y_final[len(ys) :], strict=True)
        }
        assert pairs == {(r.tobytes(), c) for r, c in zip(Xpool[masked != -1], yt, strict=True)}


@pytest.mark.parametrize("transductive", [False, True], ids=["pool", "pool+test"])
def test_adapter_is_fitted_on_the_given_target_samples_without_labels(transductive, monkeypatch):
    """The adapter sees the source and the pool it is given, never a label; the test
    samples only when the caller puts their features in the pool (labelled -1)."""
    from skada import SubspaceAlignmentAdapter

    Xs, ys, Xpool, masked, Xq, _ = _shift(n_lab=3)
    if transductive:
        Xpool, masked = np.vstack([Xpool, Xq]), np.r_[masked, np.full(len(Xq), -1)]
    seen = []
    real = SubspaceAlignmentAdapter.fit_transform

    def fit_transform(self, X, y=None, *, sample_domain=None, **kw):
        seen.append((X.copy(), sample_domain.copy(), y))
        return real(self, X, y, sample_domain=sample_domain, **kw)

    monkeypatch.setattr(SubspaceAlignmentAdapter, "fit_transform", fit_transform)
    skada_predict("sa_svm", {"c": 1.0}, Xs, ys, Xpool, masked, Xq)
    assert seen
    for X, sd, y in seen:
        assert y is None and len(X) == len(Xs) + len(Xpool) and np.sum(sd < 0) == len(Xpool)
        rows = {r.tobytes() for r in X[sd < 0]}
        assert rows == {r.tobytes() for r in Xpool}
        assert all((r.tobytes() in rows) == transductive for r in Xq)


def test_sa_dimension_and_c_are_chosen_by_per_class_cv():
    Xs, ys, Xpool, masked, Xq, yq = _shift(n_lab=3)
    _, info = skada_predict("sa_svm", {}, Xs, ys, Xpool, masked, Xq)
    # The rank bound: 12 features, so d in {10} of SA_DIMENSIONS; C over the whole grid.
    assert [r["n_components"] for r in info["cv"]] == [10] * len(baselines.SVM_C_GRID)
    assert [r["c"] for r in info["cv"]] == list(baselines.SVM_C_GRID)
    best = max(info["cv"], key=lambda r: (r["cv_accuracy"], -r["cv_hinge"]))
    assert info["chosen"] == {"n_components": best["n_components"], "c": best["c"]}
    _, fixed = skada_predict("sa_svm", {"n_components": 4, "c": 0.1}, Xs, ys, Xpool, masked, Xq)
    assert fixed["chosen"] == {"n_components": 4, "c": 0.1} and fixed["cv"] is None


def test_without_folds_sa_uses_the_fallback_configuration():
    Xs, ys, Xpool, masked, Xq, _ = _shift(n_lab=1)
    Xs, Xpool = np.hstack([Xs, Xs, Xs]), np.hstack([Xpool, Xpool, Xpool])  # 36 features
    Xq = np.hstack([Xq, Xq, Xq])
    pool, pool_y = np.vstack([Xpool, Xq]), np.r_[masked, np.full(len(Xq), -1)]  # d up to 44
    _, info = skada_predict("sa_svm", {}, Xs, ys, pool, pool_y, Xq)
    assert info["cv"] is None
    assert info["chosen"] == {"n_components": SA_FALLBACK_DIMENSION, "c": SVM_C_FALLBACK}


def test_too_large_a_subspace_names_the_bound_and_the_fix():
    Xs, ys, Xpool, masked, Xq, _ = _shift(n_lab=3)
    with pytest.raises(ValueError, match=r"n_components=50 is more than this split allows \(12"):
        skada_predict("sa_svm", {"n_components": 50}, Xs, ys, Xpool, masked, Xq)
    with pytest.raises(ValueError, match="unknown skada baseline 'tca_svm'"):
        skada_predict("tca_svm", {}, Xs, ys, Xpool, masked, Xq)


@pytest.mark.parametrize("method", ["sa_svm", "kmm_svm"])
def test_predictions_do_not_depend_on_how_the_target_samples_are_listed(method):
    """A study lists a split's target samples by index, ``mmdtl2 office`` and the
    benchmarks as the split file does: the same samples give the same predictions."""
    from mmdtl2_dist.core.preprocessing import fit_preprocessing
    from mmdtl2_dist.datasets.office_caltech import load_domain, load_hoffman_splits

    src, tgt = load_domain("dslr"), load_domain("webcam")
    Xs_all = fit_preprocessing(src.X, "l2_zscore").transform(src.X)
    Xt_all = fit_preprocessing(tgt.X, "l2_zscore").transform(tgt.X)
    sp = load_hoffman_splits("dslr", "webcam")[1]
    lab, test = sp.target_train, sp.target_test
    Xs, ys = Xs_all[sp.source_train], src.y[sp.source_train]

    def predict(pool_rows):
        masked = np.where(np.isin(pool_rows, lab), tgt.y[pool_rows], -1)
        return skada_predict(method, {}, Xs, ys, Xt_all[pool_rows], masked, Xt_all[test])

    (y1, info1), (y2, info2) = predict(np.r_[lab, test]), predict(np.sort(np.r_[lab, test]))
    np.testing.assert_array_equal(y1, y2)
    assert info1["chosen"] == info2["chosen"]
