"""Methods evaluated beside the core's on the same splits.

- ``ncm``: nearest class mean in a kernel space, computed from the Gram blocks alone
  (the labelled target samples, or the source samples when there are none and both
  devices share a space). A cheap sanity column.
- ``coral_svm``: skada's CORAL (Sun et al., 2016) then a linear SVM.
- ``sa_svm``: skada's subspace alignment (Fernando et al., 2013) then a linear SVM.

The two skada methods need *features*, not Grams: a trial reads the rows it needs from
the feature store and applies the device's frozen preprocessing (the statistics stored
with the Gram), so they see the same preprocessed features as the Gram methods. They are
limited to moderate dimensions: CORAL forms an L x L covariance (it refuses
``L > MAX_CORAL_FEATURES``) and both hold the split's features in memory. Their
adaptation step is fitted on the source training samples and the target training pool
(labels of the pool hidden except the ``n`` labelled per class); the target test samples
are never seen before prediction. The SVM is trained on the adapted source samples and
the labelled target samples.
"""

from __future__ import annotations

import time

import numpy as np

MAX_CORAL_FEATURES = 8192


def nearest_class_mean(
    K_train: np.ndarray, y_train: np.ndarray, K_test: np.ndarray, sq_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest class mean from kernel values.

    ``d²(q, μ_k) = k(q, q) - 2 mean_i k(x_i, q) + mean_ij k(x_i, x_j)`` over the training
    samples ``x_i`` of class ``k``.

    Parameters
    ----------
    K_train : ndarray of shape (M, M)
        Kernel among training samples.
    y_train : ndarray of shape (M,)
        Their labels.
    K_test : ndarray of shape (M, Q)
        Kernel between training and test samples.
    sq_test : ndarray of shape (Q,)
        ``k(q, q)`` of the test samples.

    Returns
    -------
    y_pred : ndarray of shape (Q,)
    scores : ndarray of shape (Q, K)
        Negative squared distances.
    classes : ndarray of shape (K,)
    """
    classes = np.unique(y_train)
    scores = np.empty((K_test.shape[1], classes.size))
    for j, k in enumerate(classes):
        m = y_train == k
        scores[:, j] = -(sq_test - 2 * K_test[m].mean(axis=0) + K_train[np.ix_(m, m)].mean())
    return classes[np.argmax(scores, axis=1)], scores, classes


def rbf_from_linear(G: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, gamma: float) -> np.ndarray:
    """``exp(-gamma ||a - b||²)`` from a linear Gram block and squared norms."""
    d2 = np.maximum(sq_a[:, None] + sq_b[None, :] - 2 * G, 0.0)
    return np.exp(-gamma * d2)


def ncm_predict(blocks, params: dict) -> tuple[np.ndarray, dict]:
    """The ``ncm`` method on a trial's Gram blocks (see :class:`study.trial.Blocks`)."""
    t0 = time.perf_counter()
    if blocks.yt.size:
        K, Kq, y = blocks.Ktt, blocks.Ktq, blocks.yt
        sq_train = np.diag(blocks.Ktt)
    elif blocks.Ksq is not None:
        K, Kq, y = blocks.Kss, blocks.Ksq, blocks.ys
        sq_train = np.diag(blocks.Kss)
    else:
        raise ValueError("ncm with 0 target samples needs source and target in one space.")
    sq_q = blocks.sq_q
    kernel = params.get("kernel", "linear")
    if kernel == "rbf":
        gamma = params.get("gamma", "auto")
        if gamma == "auto":  # 1 / mean squared distance among training samples
            d2 = np.maximum(sq_train[:, None] + sq_train[None, :] - 2 * K, 0)
            gamma = 1.0 / max(float(d2.mean()), 1e-12)
        K = rbf_from_linear(K, sq_train, sq_train, gamma)
        Kq = rbf_from_linear(Kq, sq_train, sq_q, gamma)
        sq_q = np.ones_like(sq_q)
    elif kernel != "linear":
        raise ValueError(f"ncm supports kernel 'linear' or 'rbf', got {kernel!r}.")
    y_pred, _, _ = nearest_class_mean(K, y, Kq, sq_q)
    return y_pred, {"time_total_s": time.perf_counter() - t0}


def skada_predict(
    method: str,
    params: dict,
    Xs: np.ndarray,
    ys: np.ndarray,
    Xpool: np.ndarray,
    ypool_masked: np.ndarray,
    Xq: np.ndarray,
) -> tuple[np.ndarray, dict]:
    """CORAL or subspace alignment (skada) followed by a linear SVM.

    Parameters
    ----------
    method : {"coral_svm", "sa_svm"}
        Which adapter.
    params : dict
        ``reg`` (CORAL, default "auto"), ``n_components`` (SA, default
        ``min(50, samples - 1)``), ``c`` (SVM C, default 1).
    Xs, ys : ndarray
        Preprocessed source training features and labels.
    Xpool, ypool_masked : ndarray
        Target training pool; labels are -1 except for the labelled samples.
    Xq : ndarray
        Target test features.
    """
    import sklearn
    from skada import CORALAdapter, SubspaceAlignmentAdapter, make_da_pipeline
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
    else:
        raise ValueError(f"unknown skada baseline {method!r}.")
    pipe = make_da_pipeline(adapter, SVC(kernel="linear", C=float(params.get("c", 1.0))))
    X = np.vstack([Xs, Xpool])
    y = np.concatenate([ys, ypool_masked])
    sd = np.concatenate([np.ones(len(ys), dtype=int), -np.ones(len(ypool_masked), dtype=int)])
    # skada turns metadata routing on at import, but sklearn's config is per thread and
    # Ray Tune runs a trial in a thread of its own.
    with sklearn.config_context(enable_metadata_routing=True):
        pipe.fit(X, y, sample_domain=sd)
        y_pred = pipe.predict(Xq, sample_domain=-np.ones(len(Xq), dtype=int))
    return np.asarray(y_pred), {"time_total_s": time.perf_counter() - t0}
