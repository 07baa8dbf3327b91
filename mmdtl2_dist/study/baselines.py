"""Established shallow adaptation methods (skada) evaluated beside the core's, on the same splits.

- ``coral_svm``: CORAL (Sun et al., 2016) then a linear SVM.
- ``sa_svm``: subspace alignment (Fernando et al., 2013) then a linear SVM.
- ``kmm_svm``: kernel mean matching (Huang et al., 2007) reweighting of the source
  samples, then a linear SVM trained with those sample weights.

The skada methods need *features*, not Grams: a trial reads the rows it needs from
the feature store and applies the device's frozen preprocessing (the statistics stored
with the Gram), so they see the same preprocessed features as the Gram methods. They are
limited to moderate dimensions: CORAL forms an L x L covariance (it refuses
``L > MAX_CORAL_FEATURES``) and all hold the split's features in memory. Their
adaptation step is fitted on the source training samples and the target training pool
(labels of the pool hidden except the ``n`` labelled per class); the target test samples
are never seen before prediction. The SVM is trained on the adapted source samples and
the labelled target samples.
"""

from __future__ import annotations

import time

import numpy as np

MAX_CORAL_FEATURES = 8192


def skada_predict(
    method: str,
    params: dict,
    Xs: np.ndarray,
    ys: np.ndarray,
    Xpool: np.ndarray,
    ypool_masked: np.ndarray,
    Xq: np.ndarray,
) -> tuple[np.ndarray, dict]:
    """A skada adapter (CORAL, subspace alignment or KMM) followed by a linear SVM.

    Parameters
    ----------
    method : {"coral_svm", "sa_svm", "kmm_svm"}
        Which adapter.
    params : dict
        ``reg`` (CORAL, default "auto"), ``n_components`` (SA, default
        ``min(50, samples - 1)``), ``kmm_gamma`` and ``kmm_B`` (KMM's RBF kernel width,
        default skada's, and weight bound, default 1000), ``c`` (SVM C, default 1).
    Xs, ys : ndarray
        Preprocessed source training features and labels.
    Xpool, ypool_masked : ndarray
        Target training pool; labels are -1 except for the labelled samples.
    Xq : ndarray
        Target test features.
    """
    import sklearn
    from skada import (
        CORALAdapter,
        KMMReweightAdapter,
        SubspaceAlignmentAdapter,
        make_da_pipeline,
    )
    from sklearn.svm import SVC

    t0 = time.perf_counter()
    if method == "coral_svm":
        if Xs.shape[1] > MAX_CORAL_FEATURES:
            raise ValueError(
                f"coral_svm forms a {Xs.shape[1]} x {Xs.shape[1]} covariance; it is limited "
                f"to {MAX_CORAL_FEATURES} features. Drop it from studies of this space."
            )
        adapter = CORALAdapter(reg=params.get("reg", "auto"))
    elif method == "sa_svm":
        n_comp = params.get("n_components", min(50, Xs.shape[0] - 1, Xpool.shape[0] - 1))
        adapter = SubspaceAlignmentAdapter(n_components=int(n_comp), random_state=0)
    elif method == "kmm_svm":
        adapter = KMMReweightAdapter(
            gamma=params.get("kmm_gamma"), B=float(params.get("kmm_B", 1000.0))
        )
    else:
        raise ValueError(f"unknown skada baseline {method!r}.")
    X = np.vstack([Xs, Xpool])
    y = np.concatenate([ys, ypool_masked])
    sd = np.concatenate([np.ones(len(ys), dtype=int), -np.ones(len(ypool_masked), dtype=int)])
    # skada turns metadata routing on at import, but sklearn's config is per thread and
    # Ray Tune runs a trial in a thread of its own.
    with sklearn.config_context(enable_metadata_routing=True):
        svm = SVC(kernel="linear", C=float(params.get("c", 1.0)))
        if method == "kmm_svm":  # the adapter's sample weights must reach the SVM
            svm = svm.set_fit_request(sample_weight=True)
        pipe = make_da_pipeline(adapter, svm)
        pipe.fit(X, y, sample_domain=sd)
        y_pred = pipe.predict(Xq, sample_domain=-np.ones(len(Xq), dtype=int))
    return np.asarray(y_pred), {"time_total_s": time.perf_counter() - t0}
