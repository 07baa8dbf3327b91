"""The sklearn-style estimators: conventions, equivalences, bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from mmdt_explicit import fit_mmdt_explicit
from sklearn.utils.estimator_checks import parametrize_with_checks

from mmdtl2_dist.core.adapter import AdapterState
from mmdtl2_dist.core.preprocessing import fit_preprocessing
from mmdtl2_dist.estimators import MMDT, MMDTL2, MMDTHoffman, SourceSVM, TargetSVM


def make_devices(seed=0, K=3, N=60, M=12, Q=60, Ls=6, Lt=6):
    """Two devices: class means differ by a fixed linear distortion and an offset."""
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((K, Ls)) * 2
    T = rng.standard_normal((Ls, Lt)) * 0.7 + np.eye(Ls, Lt)
    ys = np.r_[np.arange(K), rng.integers(0, K, N - K)]
    yt = np.r_[np.tile(np.arange(K), 2), rng.integers(0, K, M - 2 * K)]
    yq = rng.integers(0, K, Q)
    Xs = mu[ys] + rng.standard_normal((N, Ls))
    Xt = mu[yt] @ T + 0.5 + rng.standard_normal((M, Lt))
    Xq = mu[yq] @ T + 0.5 + rng.standard_normal((Q, Lt))
    return Xs, ys, Xt, yt, Xq, yq


class MMDTL2OneDevice(MMDTL2):
    """MMDTL2 fitted with every row both a source and a labelled target sample.

    scikit-learn's checks call ``fit(X, y)``, which MMDTL2 refuses without
    ``sample_domain`` (test_adaptation_fit_without_sample_domain_names_both_calls).
    ``fit_domains(X, y, X, y)`` is the no-shift problem on those rows: the checks then run
    MMDTL2's own validation, fitted attributes, prediction, cloning and pickling.
    """

    def fit(self, X, y):
        return self.fit_domains(X, y, X, y)


# Deviations from scikit-learn's checks, with reasons:
# - none of the checks below is expected to fail;
# - MMDTL2 is checked through MMDTL2OneDevice (above): its fit(X, y) needs sample_domain.
#   SourceSVM and TargetSVM fit(X, y) as plain classifiers and are checked as they are.
# - MMDT (explicit W) is not run through them: on the no-shift problem every sample is
#   also a labelled target, so its W-step dual has K·n variables with a Hessian of rank
#   K·(L+1) on the checks' 2-5-d data, and the checks' many fits take minutes. It shares
#   the validation and prediction code of the estimators checked here, and its maths is
#   tested against MMDTL2 (test_mmdtl2_cf1_cd0_equals_mmdt_paper_form).
# - MMDTHoffman is transductive (it refits per predicted batch), like the code it
#   reproduces, which the checks cannot accommodate.
EXPECTED_FAILED: dict[str, str] = {}


@parametrize_with_checks(
    [MMDTL2OneDevice(), SourceSVM(), TargetSVM()],
    expected_failed_checks=lambda est: EXPECTED_FAILED,
)
def test_sklearn_checks(estimator, check):
    check(estimator)


def test_skada_sample_domain_equals_fit_domains():
    Xs, ys, Xt, yt, Xq, _ = make_devices()
    X, y = np.vstack([Xs, Xt]), np.r_[ys, yt]
    sd = np.r_[np.ones(len(ys)), -np.ones(len(yt))]
    a = MMDTL2().fit(X, y, sample_domain=sd)
    b = MMDTL2().fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_array_equal(a.decision_function(Xq), b.decision_function(Xq))
    # Source rows are scored by the source-space classifier when flagged.
    mixed = a.predict(np.vstack([Xs[:5], Xq[:5]]), sample_domain=np.r_[np.ones(5), -np.ones(5)])
    np.testing.assert_array_equal(mixed[5:], a.predict(Xq[:5]))
    np.testing.assert_array_equal(
        mixed[:5], a.classes_[np.argmax(Xs[:5] @ a.coef_source_.T + a.intercept_, 1)]
    )


def skada_inputs(seed=0):
    """One X, y and sample_domain (source 1, target -1), and target query rows."""
    Xs, ys, Xt, yt, Xq, _ = make_devices(seed)
    sd = np.r_[np.ones(len(ys), dtype=int), -np.ones(len(yt), dtype=int)]
    return np.vstack([Xs, Xt]), np.r_[ys, yt], sd, Xq


@pytest.mark.parametrize("Est", [MMDTL2, MMDT, MMDTHoffman])
def test_adaptation_fit_without_sample_domain_names_both_calls(Est):
    X, y, _, _ = skada_inputs()
    with pytest.raises(ValueError, match=f"{Est.__name__}.fit needs sample_domain") as e:
        Est().fit(X, y)
    assert "sample_domain=np.r_[np.ones(n_source), -np.ones(n_target)]" in str(e.value)
    assert f"{Est.__name__}().fit_domains(Xs, ys, Xt, yt)" in str(e.value)


def test_single_domain_baselines_fit_all_rows_without_sample_domain():
    """SourceSVM: every row a source sample; TargetSVM: every row a labelled target sample."""
    X, y, _, Xq = skada_inputs(1)
    y = np.where(y == 0, -1, y)  # without sample_domain, -1 is a class as in scikit-learn
    src = SourceSVM().fit(X, y)
    np.testing.assert_array_equal(
        src.decision_function(Xq), SourceSVM().fit_domains(X, y).decision_function(Xq)
    )
    tgt = TargetSVM().fit(X, y)
    np.testing.assert_array_equal(
        tgt.decision_function(Xq), TargetSVM().fit_domains(None, None, X, y).decision_function(Xq)
    )
    assert -1 in src.classes_ and -1 in tgt.classes_


@pytest.mark.parametrize("Est", [MMDTL2, SourceSVM, TargetSVM])
def test_sample_domain_is_keyword_only(Est):
    X, y, sd, Xq = skada_inputs(2)
    with pytest.raises(TypeError):
        Est().fit(X, y, sd)
    est = Est().fit(X, y, sample_domain=sd)
    sq = -np.ones(len(Xq), dtype=int)
    for method in (est.predict, est.decision_function):
        with pytest.raises(TypeError):
            method(Xq, sq)
    with pytest.raises(TypeError):
        est.score(Xq, est.predict(Xq), sq)
    np.testing.assert_array_equal(est.predict(Xq, sample_domain=sq), est.predict(Xq))
    np.testing.assert_array_equal(est.predict(Xq, sample_domain=-1), est.predict(Xq))
    assert est.score(Xq, est.predict(Xq), sample_domain=sq) == 1.0


@pytest.mark.parametrize("Est", [MMDTL2, MMDT, SourceSVM, TargetSVM])
def test_several_source_or_target_domains_are_refused_by_id(Est):
    X, y, sd, Xq = skada_inputs(3)
    two_sources = np.where(np.arange(len(sd)) % 2 == 0, sd, 2 * sd).clip(-1)
    two_targets = np.where(np.arange(len(sd)) % 2 == 0, sd, 3 * sd).clip(None, 1)
    with pytest.raises(ValueError, match=r"holds 2 source domains \[1, 2\]") as e:
        Est().fit(X, y, sample_domain=two_sources)
    assert "Fit one model per source domain" in str(e.value)
    assert "np.sign(sample_domain)" in str(e.value)
    with pytest.raises(ValueError, match=r"holds 2 target domains \[-3, -1\]"):
        Est().fit(X, y, sample_domain=two_targets)
    est = Est().fit(X, y, sample_domain=np.sign(two_targets))  # the named fix
    with pytest.raises(ValueError, match=r"holds 2 target domains \[-2, -1\]"):
        est.predict(Xq, sample_domain=np.r_[-1, -2, -np.ones(len(Xq) - 2, dtype=int)])


@pytest.mark.parametrize("Est", [MMDT, MMDTHoffman, SourceSVM, TargetSVM])
def test_unlabelled_target_rows_are_not_a_class_and_enter_the_target_statistics(Est):
    """skada marks an unlabelled target sample with y = -1; it is not a class here. The
    methods other than MMDTL2 learn from labelled samples only, and take the unlabelled
    ones into the target device's preprocessing statistics, as MMDTL2 and the studies
    do (so a baseline is compared with the same statistics): ``fit`` with -1 rows equals
    ``fit_domains(..., Xt_unlabelled=those rows)``, and differs from the fit without them
    (their statistics differ)."""
    kw = {"pca_dim": None} if Est is MMDTHoffman else {}  # a PCA too wide for 40 samples
    X, y, sd, Xq = skada_inputs(4)
    y = y.copy()
    unl = np.flatnonzero(sd < 0)[[0, 4]]
    y[unl] = -1
    a = Est(preprocessing="zscore", **kw).fit(X, y, sample_domain=sd)
    assert -1 not in a.classes_ and a.n_unlabelled_target_ == 2
    lab = (sd < 0) & (y != -1)
    b = Est(preprocessing="zscore", **kw).fit_domains(
        X[sd > 0], y[sd > 0], X[lab], y[lab], Xt_unlabelled=X[unl]
    )
    np.testing.assert_array_equal(a.decision_function(Xq), b.decision_function(Xq))
    device = fit_preprocessing(X[sd < 0], "zscore")
    np.testing.assert_allclose(a.target_preprocessing_.transform(Xq), device.transform(Xq))
    c = Est(preprocessing="zscore", **kw).fit_domains(X[sd > 0], y[sd > 0], X[lab], y[lab])
    assert c.n_unlabelled_target_ == 0
    assert not np.allclose(c.target_preprocessing_.transform(Xq), device.transform(Xq))
    with pytest.raises(ValueError, match="Xt_unlabelled"):
        Est().fit_domains(X[sd > 0], y[sd > 0], X[lab], y[lab], Xt_unlabelled=X[unl][:, :2])


def test_a_source_svm_takes_the_target_statistics_from_unlabelled_samples_alone():
    """Without labelled target samples the source SVM's target statistics are those of the
    unlabelled target samples (per-device standardisation, the study's protocol); without
    either, target samples get the source's."""
    X, y, sd, Xq = skada_inputs(6)
    src = sd > 0
    est = SourceSVM(preprocessing="zscore").fit_domains(X[src], y[src], Xt_unlabelled=Xq)
    device = fit_preprocessing(Xq, "zscore")
    np.testing.assert_allclose(est.target_preprocessing_.transform(Xq), device.transform(Xq))
    plain = SourceSVM(preprocessing="zscore").fit_domains(X[src], y[src])
    assert plain.target_preprocessing_ is None
    np.testing.assert_array_equal(plain.coef_, est.coef_)  # the SVM is the same


@pytest.mark.parametrize("Est", [MMDTL2, MMDT, MMDTHoffman, TargetSVM, SourceSVM])
def test_every_target_row_unlabelled_is_refused_only_where_labels_are_needed(Est):
    """skada's default pipeline masks every target label (-1): the methods that learn from
    labelled targets refuse, naming the pipeline option; the source SVM fits on the
    source with the target statistics of those rows, as ``fit_domains`` does."""
    X, y, sd, Xq = skada_inputs(7)
    y = np.where(sd < 0, -1, y)
    if Est is SourceSVM:
        a = Est(preprocessing="zscore").fit(X, y, sample_domain=sd)
        b = Est(preprocessing="zscore").fit_domains(X[sd > 0], y[sd > 0], Xt_unlabelled=X[sd < 0])
        assert a.n_unlabelled_target_ == int((sd < 0).sum())
        np.testing.assert_array_equal(a.decision_function(Xq), b.decision_function(Xq))
        return
    with pytest.raises(ValueError, match="every target row .* is labelled -1") as e:
        Est().fit(X, y, sample_domain=sd)
    assert "mask_target_labels=False" in str(e.value)


def test_mmdtl2_takes_unlabelled_target_rows_as_fit_domains_xt_unlabelled():
    """y = -1 on a target row (skada's mark) == the row passed as Xt_unlabelled."""
    X, y, sd, Xq = skada_inputs(4)
    y = y.copy()
    unl = np.flatnonzero(sd < 0)[[0, 4]]
    y[unl] = -1
    a = MMDTL2(preprocessing="zscore").fit(X, y, sample_domain=sd)
    lab = (sd < 0) & (y != -1)
    b = MMDTL2(preprocessing="zscore").fit_domains(
        X[sd > 0], y[sd > 0], X[lab], y[lab], Xt_unlabelled=X[unl]
    )
    assert -1 not in a.classes_ and a.n_unlabelled_target_ == 2
    np.testing.assert_array_equal(a.decision_function(Xq), b.decision_function(Xq))


def test_target_statistics_are_over_labelled_and_unlabelled_samples():
    """The README: preprocessing statistics are per device, over all its given samples."""

    Xs, ys, Xt, yt, Xq, _ = make_devices(7)
    est = MMDTL2(preprocessing="l2_zscore").fit_domains(Xs, ys, Xt, yt, Xt_unlabelled=Xq)
    device = fit_preprocessing(np.vstack([Xt, Xq]), "l2_zscore")
    np.testing.assert_allclose(est.target_preprocessing_.transform(Xq), device.transform(Xq))
    with pytest.raises(ValueError, match="Xt_unlabelled"):
        MMDTL2().fit_domains(Xs, ys, Xt, yt, Xt_unlabelled=Xq[:, :3])


def test_sample_domain_values_are_checked():
    X, y, sd, Xq = skada_inputs(5)
    for bad in (np.where(sd > 0, np.nan, -1.0), sd.astype(str), sd > 0):
        with pytest.raises(ValueError, match="sample_domain must be finite integers"):
            MMDTL2().fit(X, y, sample_domain=bad)
    est = MMDTL2().fit(X, y, sample_domain=sd)
    with pytest.raises(ValueError, match="one domain per sample"):
        est.predict(Xq, sample_domain=-np.ones(3, dtype=int))
    with pytest.raises(ValueError, match="never 0"):
        est.predict(Xq, sample_domain=np.zeros(len(Xq), dtype=int))


@pytest.fixture()
def skada_pipeline():
    """skada's make_da_pipeline, with scikit-learn's global routing flag left as it was.

    Importing skada turns scikit-learn's metadata routing on for the whole process; the
    pipeline runs inside a config_context that turns it on, and the flag is restored.
    """
    import sklearn

    was = sklearn.get_config()["enable_metadata_routing"]
    skada = pytest.importorskip("skada")
    sklearn.set_config(enable_metadata_routing=was)
    with sklearn.config_context(enable_metadata_routing=True):
        yield skada.make_da_pipeline


def test_skada_pipeline_routes_sample_domain(skada_pipeline):
    X, y, sd, Xq = skada_inputs(6)
    Xs, ys, Xt, yt = X[sd > 0], y[sd > 0], X[sd < 0], y[sd < 0]
    ref = MMDTL2(preprocessing="l2").fit_domains(Xs, ys, Xt, yt)
    pipe = skada_pipeline(MMDTL2(preprocessing="l2"), mask_target_labels=False)
    pipe.fit(X, y.copy(), sample_domain=sd)
    sq = -np.ones(len(Xq), dtype=int)
    np.testing.assert_array_equal(pipe.predict(Xq, sample_domain=sq), ref.predict(Xq))
    np.testing.assert_array_equal(pipe.decision_function(Xq), ref.decision_function(Xq))
    # skada's default masks every target label with -1: refused, naming the pipeline fix.
    with pytest.raises(ValueError, match=r"mask_target_labels=False"):
        skada_pipeline(MMDTL2()).fit(X, y.copy(), sample_domain=sd)


def test_mmdt_gram_form_equals_mmdt_with_an_explicit_w():
    """MMDT (MMDTL2 in Gram form, C and G, at c_f = 1, c_d = 0) == MMDT's alternation with
    an explicit W and explicit features (tests/mmdt_explicit.py, no Gram algebra)."""
    Xs, ys, Xt, yt, Xq, _ = make_devices(1, Lt=4)
    kw = dict(c_t=1.0, c_s=0.05, max_iter=3, tol=0.0, qp_tol=1e-10)
    a = MMDT(**kw).fit_domains(Xs, ys, Xt, yt)
    classes = np.unique(ys)
    W, Theta, b, _ = fit_mmdt_explicit(
        Xs, np.searchsorted(classes, ys), Xt, np.searchsorted(classes, yt), len(classes),
        c_t=1.0, c_s=0.05, max_iter=3, tol=0.0, qp_tol=1e-10,
    )  # fmt: skip
    Xq_h = np.hstack([Xq, np.ones((len(Xq), 1))])

    # Same strictly convex sub-problems, solved by different routes (dual box QP on Grams
    # vs an interior-point primal on explicit features, gaps ~1e-8): 1e-5 relative.
    def rel(x, y):
        return np.linalg.norm(x - y) / np.linalg.norm(y)

    assert rel(a.W_, W) <= 1e-5
    assert rel(a.transform(Xq), Xq_h @ W.T) <= 1e-5
    assert rel(a.decision_function(Xq), Xq_h @ W.T @ Theta + b) <= 1e-5
    # the same estimator as MMDTL2 with MMDT's settings, to the bit
    c = MMDTL2(c_f=1.0, c_d=0.0, **kw).fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_array_equal(c.decision_function(Xq), a.decision_function(Xq))


def test_different_feature_dimensions_and_explicit_w():
    Xs, ys, Xt, yt, Xq, yq = make_devices(2, Ls=7, Lt=3)
    m = MMDTL2().fit_domains(Xs, ys, Xt, yt)
    W = m.transform_matrix()
    assert W.shape == (7, 4)
    np.testing.assert_allclose(m.transform(Xq), Xq @ W[:, :-1].T + W[:, -1], rtol=1e-9, atol=1e-10)
    scores = m.transform(Xq) @ m.coef_source_.T + m.intercept_
    np.testing.assert_allclose(m.decision_function(Xq), scores, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="identity prior needs equal"):
        MMDTL2(prior="identity").fit_domains(Xs, ys, Xt, yt)
    # A user-supplied W0 works across dimensions; W0 = 0 is the paper exactly.
    zero = MMDTL2(prior="matrix", W0=np.zeros((7, 3))).fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_allclose(
        zero.decision_function(Xq), m.decision_function(Xq), rtol=1e-12, atol=1e-12
    )
    assert m.score(Xq, yq) > 1.0 / 3


def test_matrix_prior_gram_form_equals_feature_form_across_dimensions():
    """Ls != Lt with a user map W0 (bias column included) and a weight μ: the core's Gram
    form (GramProblem.from_features(..., W0=...), only Gram blocks of the mapped targets)
    equals the estimator's feature form (Z = [Xs; μ(W0 x̂ + w0)], explicit features).
    Both solve the same QPs to a KKT residual of 1e-8 from different Gram arithmetic, so
    scores agree to ~1e-7; 1e-6 relative leaves a margin."""
    from mmdtl2_dist.core.methods import GramProblem, fit_predict

    Xs, ys, Xt, yt, Xq, _ = make_devices(6, Ls=7, Lt=4)
    W0 = np.random.default_rng(1).standard_normal((7, 5)) * 0.5
    for mu in (0.0, 0.5, 1.0):
        m = MMDTL2(prior="matrix", W0=W0, prior_weight=mu).fit_domains(Xs, ys, Xt, yt)
        prob = GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=W0)
        res = fit_predict("mmdtl2", {"prior": "matrix", "prior_weight": mu}, prob)
        ref = m.decision_function(Xq)
        assert np.linalg.norm(res.scores - ref) <= 1e-6 * np.linalg.norm(ref)
    # μ W0 with μ = 0 is the paper's zero prior; the core asks for the mapped Grams.
    paper = MMDTL2().fit_domains(Xs, ys, Xt, yt).decision_function(Xq)
    np.testing.assert_allclose(
        MMDTL2(prior="matrix", W0=W0, prior_weight=0.0).fit_domains(Xs, ys, Xt, yt)
        .decision_function(Xq), paper, rtol=1e-10, atol=1e-10,
    )  # fmt: skip
    with pytest.raises(ValueError, match="mapped targets.*from_features"):
        fit_predict("mmdtl2", {"prior": "matrix"}, GramProblem.from_features(Xs, ys, Xt, yt, Xq))
    # W0 without a bias column is W0 with a zero one; any other shape is refused.
    no_bias = GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=W0[:, :-1])
    zero_bias = GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=np.c_[W0[:, :-1], np.zeros(7)])
    np.testing.assert_allclose(no_bias.Kuuq, zero_bias.Kuuq, rtol=1e-12)
    with pytest.raises(ValueError, match=r"W0 must have shape \(Ls, Lt\)"):
        GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=W0[:, :-2])


def test_matrix_prior_identity_map_equals_identity_prior():
    """W0 = [I | 0] as a user map gives the identity prior, in the core and the estimator."""
    from mmdtl2_dist.core.methods import GramProblem, fit_predict

    Xs, ys, Xt, yt, Xq, _ = make_devices(7)
    I0 = np.hstack([np.eye(6), np.zeros((6, 1))])
    prob = GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=I0)
    for mu in (0.25, 1.0):
        a = fit_predict("mmdtl2", {"prior": "matrix", "prior_weight": mu}, prob).scores
        b = fit_predict("mmdtl2", {"prior": "identity", "prior_weight": mu}, prob).scores
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
        e = MMDTL2(prior="matrix", W0=np.eye(6), prior_weight=mu).fit_domains(Xs, ys, Xt, yt)
        f = MMDTL2(prior="identity", prior_weight=mu).fit_domains(Xs, ys, Xt, yt)
        np.testing.assert_allclose(
            e.decision_function(Xq), f.decision_function(Xq), rtol=1e-10, atol=1e-10
        )
        np.testing.assert_allclose(e.transform(Xq), f.transform(Xq), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(
            e.transform_matrix(), f.transform_matrix(), rtol=1e-10, atol=1e-10
        )


def test_identity_prior_forms_no_dense_identity():
    """The identity prior at 12,000-d allocates far less than the 1.15 GB an explicit
    identity matrix would take (features are 3 MB; the bound leaves room for the Grams and
    the solver); transform() equals μ x + (the learned part) there too."""
    import tracemalloc

    rng = np.random.default_rng(0)
    L, N, M = 12_000, 20, 6
    ys, yt = np.arange(N) % 2, np.arange(M) % 2
    Xs = rng.standard_normal((N, L)) + ys[:, None]
    Xt = rng.standard_normal((M, L)) + yt[:, None]
    tracemalloc.start()
    m = MMDTL2(prior="identity", prior_weight=0.5).fit_domains(Xs, ys, Xt, yt)
    WX = m.transform(Xt[:2])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6, f"peak {peak / 1e6:.0f} MB"
    assert WX.shape == (2, L) and np.all(np.isfinite(WX))


def test_select_weight_of_a_user_map():
    """select="prior_weight" with prior="matrix" cross-validates μ in μ W0 (Ls != Lt), and
    the selected model equals the model fitted directly with the chosen weight."""
    from mmdtl2_dist.core.selection import PRIOR_WEIGHTS

    Xs, ys, Xt, yt, Xq, _ = make_devices(8, M=18, Ls=7, Lt=4)
    W0 = np.random.default_rng(2).standard_normal((7, 4)) * 0.5
    m = MMDTL2(prior="matrix", W0=W0, select="prior_weight").fit_domains(Xs, ys, Xt, yt)
    assert [r["params"]["prior"] for r in m.selection_] == ["matrix"] * len(PRIOR_WEIGHTS)
    assert [r["params"]["prior_weight"] for r in m.selection_] == list(PRIOR_WEIGHTS)
    best = min(m.selection_, key=lambda r: r["cv_hinge"])["params"]["prior_weight"]
    assert m.selected_params_["prior_weight"] == best
    assert m.selected_params_ == {"prior_weight": best}
    direct = MMDTL2(prior="matrix", W0=W0, **m.selected_params_).fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_allclose(
        m.decision_function(Xq), direct.decision_function(Xq), rtol=1e-10, atol=1e-10
    )


def test_selection_with_too_few_samples_keeps_the_estimators_parameters():
    """One labelled target per class: no fold can be formed, so select warns and fits with
    the estimator's own parameters (here the user's map at weight 1), not the grid's
    first entry (weight 0 would silently drop the map)."""
    from mmdtl2_dist.core.selection import choose

    Xs, ys, Xt, yt, Xq, _ = make_devices(9, Ls=7, Lt=4)
    Xt, yt = Xt[:3], yt[:3]  # one sample of each of the 3 classes
    W0 = np.random.default_rng(3).standard_normal((7, 4)) * 0.5
    with pytest.warns(UserWarning, match="too few labelled target samples"):
        m = MMDTL2(prior="matrix", W0=W0, select="prior_weight").fit_domains(Xs, ys, Xt, yt)
    assert m.selected_params_ == {}
    assert all(r["n_folds"] == 0 and r["criterion"] == "hinge" for r in m.selection_)
    plain = MMDTL2(prior="matrix", W0=W0).fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_allclose(
        m.decision_function(Xq), plain.decision_function(Xq), rtol=1e-12, atol=1e-12
    )
    with pytest.raises(ValueError, match="no scores"):
        choose(m.selection_, "hinge")


def test_identity_prior_with_zero_weight_is_the_paper():
    Xs, ys, Xt, yt, Xq, _ = make_devices(3)
    a = MMDTL2(prior="identity", prior_weight=0.0).fit_domains(Xs, ys, Xt, yt)
    b = MMDTL2().fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_allclose(
        a.decision_function(Xq), b.decision_function(Xq), rtol=1e-10, atol=1e-10
    )


def test_selection_uses_target_training_samples_only():
    Xs, ys, Xt, yt, Xq, yq = make_devices(4, M=18)
    grid = [{"prior": "zero"}, {"prior": "identity", "c_f": 1.0}]
    m = MMDTL2(select=grid).fit_domains(Xs, ys, Xt, yt)
    assert len(m.selection_) == 2 and all(r["n_folds"] >= 2 for r in m.selection_)
    # The grid keeps c_s, c_t and the kernel: the lowest held-out hinge loss wins.
    assert {r["criterion"] for r in m.selection_} == {"hinge"}
    best = min(m.selection_, key=lambda r: r["cv_hinge"])
    assert m.selected_params_["prior"] == best["params"]["prior"]
    # The selected model equals the model fitted directly with the chosen parameters.
    direct = MMDTL2(**{k: v for k, v in best["params"].items() if k in MMDTL2().get_params()})
    np.testing.assert_allclose(
        m.decision_function(Xq),
        direct.fit_domains(Xs, ys, Xt, yt).decision_function(Xq),
        rtol=1e-10,
    )


def test_select_by_grid_name():
    """select="prior_weight" cross-validates the identity prior's mixing weight 0 … 1."""
    from mmdtl2_dist.core.selection import PRIOR_WEIGHTS

    Xs, ys, Xt, yt, Xq, _ = make_devices(4, M=18)
    Xt = Xs[: len(yt)] + 0.3 * np.random.default_rng(0).standard_normal((len(yt), Xs.shape[1]))
    yt = ys[: len(yt)]
    m = MMDTL2(select="prior_weight", c_f=10.0).fit_domains(Xs, ys, Xt, yt)
    assert [r["params"]["prior_weight"] for r in m.selection_] == list(PRIOR_WEIGHTS)
    # The grid varies the weight only: the estimator's own c_f is kept in every row.
    assert {r["params"]["c_f"] for r in m.selection_} == {10.0}
    best = min(m.selection_, key=lambda r: r["cv_hinge"])["params"]
    assert m.selected_params_ == {"prior": "identity", "prior_weight": best["prior_weight"]}
    with pytest.raises(
        ValueError, match="unknown select 'prior'.*select='auto' is the recommended.*prior_weight"
    ):
        MMDTL2(select="prior").fit_domains(Xs, ys, Xt, yt)


@pytest.mark.parametrize("kernel", ["linear", "rbf", "poly"])
def test_k2_labels_and_adapter_round_trip(kernel, tmp_path):
    Xs, ys, Xt, yt, Xq, _ = make_devices(5, K=2)
    names = np.array(["adenoma", "hyperplastic"])
    m = MMDTL2(kernel=kernel, preprocessing="l2_zscore").fit_domains(Xs, names[ys], Xt, names[yt])
    assert list(m.classes_) == ["adenoma", "hyperplastic"]
    pred = m.predict(Xq)
    assert set(pred) <= set(names)
    m.adapter_.save(tmp_path / "adapter")
    loaded = AdapterState.load(tmp_path / "adapter")
    s = loaded.decision_function(Xq)
    np.testing.assert_array_equal(s[:, 1] - s[:, 0], m.decision_function(Xq))  # binary: (n,)
    np.testing.assert_array_equal(loaded.predict(Xq), pred)


def test_hoffman_estimator_is_transductive_but_consistent():
    Xs, ys, Xt, yt, Xq, yq = make_devices(6, K=3)
    m = MMDTHoffman(pca_dim=None).fit_domains(Xs, ys, Xt, yt)
    assert m.score(Xq, yq) > 0.4
    with pytest.raises(ValueError, match="one feature space"):
        MMDTHoffman().fit_domains(Xs, ys, Xt[:, :3], yt)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("Est", [MMDTL2, MMDT, SourceSVM, TargetSVM])
def test_bad_input_errors_name_the_fix(Est):
    Xs, ys, Xt, yt, Xq, _ = make_devices(7)
    est = Est()
    bad = Xt.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN or Inf in 1 row\(s\): 3"):
        est.fit_domains(Xs, ys, bad, yt)
    with pytest.raises(ValueError, match="labels but there are"):
        est.fit_domains(Xs, ys, Xt, yt[:-1])
    with pytest.raises(ValueError, match="at least 2 classes"):
        est.fit_domains(Xs, np.zeros_like(ys), Xt, np.zeros_like(yt))
    est.fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="features, but .* is expecting"):
        est.predict(Xq[:, :-1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        est.predict(np.full((2, Xq.shape[1]), np.inf))
    with pytest.raises(ValueError, match="0 sample"):
        est.predict(Xq[:0])


@pytest.mark.parametrize("Est", [MMDTL2, MMDT])
def test_adaptation_specific_bad_input(Est):
    Xs, ys, Xt, yt, _, _ = make_devices(8)
    with pytest.raises(ValueError, match="no labelled target samples"):
        Est().fit_domains(Xs, ys, Xt[:0], yt[:0])
    with pytest.raises(ValueError, match=r"target class\(es\) \[2\] have no source sample"):
        Est().fit_domains(Xs[ys != 2], ys[ys != 2], Xt, yt)
    with pytest.raises(ValueError, match="sample_domain must be > 0"):
        Est().fit(np.vstack([Xs, Xt]), np.r_[ys, yt], sample_domain=np.zeros(len(ys) + len(yt)))
    with pytest.raises(ValueError, match="one domain per sample"):
        Est().fit(np.vstack([Xs, Xt]), np.r_[ys, yt], sample_domain=np.ones(3))


def test_target_only_classes_allowed_on_request():
    Xs, ys, Xt, yt, Xq, _ = make_devices(9)
    m = MMDTL2(allow_target_only_classes=True).fit_domains(Xs[ys != 2], ys[ys != 2], Xt, yt)
    assert 2 in m.classes_ and np.all(np.isfinite(m.decision_function(Xq)))


def test_parameter_validation():
    Xs, ys, Xt, yt, _, _ = make_devices(10)
    with pytest.raises(ValueError, match="c_f must be a positive"):
        MMDTL2(c_f=0.0).fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="kernel must be one of"):
        MMDTL2(kernel="sigmoid").fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="preprocessing must be one of"):
        MMDTL2(preprocessing="pca").fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="W0 must have shape"):
        MMDTL2(prior="matrix", W0=np.zeros((2, 2))).fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="needs W0 of shape"):
        MMDTL2(prior="matrix").fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="needs W0 of shape"):  # a grid naming the prior
        MMDTL2(select=[{"prior": "matrix"}, {"prior": "zero"}]).fit_domains(Xs, ys, Xt, yt)
    W0 = np.eye(Xs.shape[1], Xt.shape[1])
    W0[0, 0] = np.nan
    with pytest.raises(ValueError, match="W0 contains NaN or Inf"):
        MMDTL2(prior="matrix", W0=W0).fit_domains(Xs, ys, Xt, yt)
    from mmdtl2_dist.core.methods import GramProblem

    with pytest.raises(ValueError, match="W0 contains NaN or Inf"):  # the core says the same
        GramProblem.from_features(Xs, ys, Xt, yt, Xt, W0=W0)


# --- extreme feature scales, label types, hinge weights, thread limits --------------------

ALL_FITTED = [MMDTL2, MMDT, SourceSVM, TargetSVM, MMDTHoffman]


@pytest.mark.parametrize("Est", ALL_FITTED)
@pytest.mark.parametrize(
    ("scale", "problem"),
    [(1e200, "overflow float64"), (1e10, "squared norms up to"), (1e-10, "vanish beside")],
)
def test_extreme_feature_scale_is_refused_naming_the_fix(Est, scale, problem):
    """Scaled features cannot be rescaled silently (the fit is not scale-invariant)."""
    Xs, ys, Xt, yt, _, _ = make_devices(2)
    with pytest.raises(ValueError, match=problem) as e:
        Est().fit_domains(Xs * scale, ys, Xt * scale, yt)
    assert "preprocessing='none'" in str(e.value)
    assert "Use preprocessing='l2' or 'l2_zscore'" in str(e.value)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_scale_free_preprocessing_fits_any_finite_scale(scale):
    """The fix the message names works: l2 / l2_zscore give the scale-1 model."""
    Xs, ys, Xt, yt, Xq, _ = make_devices(2)
    for pre in ("l2", "l2_zscore"):
        ref = MMDTL2(preprocessing=pre).fit_domains(Xs, ys, Xt, yt)
        m = MMDTL2(preprocessing=pre).fit_domains(Xs * scale, ys, Xt * scale, yt)
        np.testing.assert_allclose(
            m.decision_function(Xq * scale), ref.decision_function(Xq), atol=1e-8
        )


@pytest.mark.parametrize("Est", [MMDTL2, SourceSVM, TargetSVM])
def test_mixed_label_types_name_the_problem(Est):
    Xs, ys, Xt, yt, _, _ = make_devices(3)
    X = np.vstack([Xs, Xt])
    y = np.array(["a"] + [0] * (len(X) - 1), dtype=object)  # first a string: sort fails
    y[1::2] = "a"
    sd = np.r_[np.ones(len(ys)), -np.ones(len(yt))]
    with pytest.raises(ValueError, match="mixes string and non-string labels") as e:
        Est().fit(X, y, sample_domain=sd)
    assert "labels must all be one type" in str(e.value)
    if Est is not TargetSVM:  # numbers on one device, strings on the other
        with pytest.raises(ValueError, match="source labels are numbers but target labels"):
            Est().fit_domains(Xs, ys, Xt, yt.astype(str))


@pytest.mark.parametrize("Est", [MMDTL2, MMDT, SourceSVM, MMDTHoffman])
def test_hinge_weight_out_of_range_names_the_parameter(Est):
    Xs, ys, Xt, yt, _, _ = make_devices(4)
    with pytest.raises(
        ValueError, match=r"c_s must be a positive number of at most 1e\+06, got 1e\+12"
    ):
        Est(c_s=1e12).fit_domains(Xs, ys, Xt, yt)
    with pytest.raises(ValueError, match="c_t must be a positive number"):
        Est(c_t="1").fit_domains(Xs, ys, Xt, yt)


def test_qp_failure_inside_the_range_names_the_hinge_weights():
    """Large (accepted) c_t on overlapping 3-d classes: the dual QPs cannot be solved."""
    rng = np.random.default_rng(1)
    Xs, ys = rng.normal(size=(60, 3)), rng.integers(0, 3, 60)
    Xt, yt = rng.normal(size=(12, 3)) + 0.3, np.repeat([0, 1, 2], 4)
    from mmdtl2_dist.core.errors import QPSolveError

    with pytest.raises(QPSolveError, match="hinge weights c_s = 0.1, c_t = 100000 bound"):
        MMDTL2(c_t=1e5).fit_domains(Xs, ys, Xt, yt)


def _blas_threads():
    from threadpoolctl import threadpool_info

    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.fixture
def blas_seen(monkeypatch):
    """Record the BLAS thread counts seen inside preprocessing, kernels and QPs of the core."""
    import mmdtl2_dist.core.kernels as kernels
    import mmdtl2_dist.core.qp as qp
    from mmdtl2_dist.core.preprocessing import PreprocessStats

    seen = []

    def spy(module, name):
        orig = getattr(module, name)

        def wrapped(*a, **k):
            seen.append(_blas_threads())
            return orig(*a, **k)

        monkeypatch.setattr(module, name, wrapped)

    spy(kernels, "kernel_from_gram")
    spy(qp, "kkt_residual")
    spy(PreprocessStats, "transform")
    return seen


@pytest.mark.parametrize("Est", ALL_FITTED)
def test_fit_and_predict_run_with_one_blas_thread_and_restore_the_limit(Est, blas_seen):
    from threadpoolctl import threadpool_limits

    Xs, ys, Xt, yt, Xq, _ = make_devices(5)
    est = Est(pca_dim=None) if Est is MMDTHoffman else Est()
    with threadpool_limits(2, user_api="blas"):  # the user's setting, above one thread
        assert _blas_threads() == {2}
        est.fit_domains(Xs, ys, Xt, yt)
        n_fit = len(blas_seen)
        assert _blas_threads() == {2}
        est.predict(Xq)
        if hasattr(est, "transform"):
            est.transform(Xq)
        assert _blas_threads() == {2}
    assert 0 < n_fit < len(blas_seen)
    assert all(s == {1} for s in blas_seen), blas_seen
    with threadpool_limits(1, user_api="blas"):  # a user's lower limit is kept, not raised
        est.predict(Xq)
        assert _blas_threads() == {1}


def test_estimator_fits_through_the_core_gram_form_bit_for_bit():
    """The estimator's fit is the core's: the same Gram blocks (GramProblem.from_features,
    the core's prior_blocks) and the same alternation, so the objectives are equal to the
    last bit, for every prior and a kernel; and select goes through core.evaluate.choose,
    so its CV table and chosen values are the core's."""
    from mmdtl2_dist.core.evaluate import choose
    from mmdtl2_dist.core.methods import GramProblem, default_params, fit_predict

    Xs, ys, Xt, yt, Xq, _ = make_devices(8)
    W0 = np.random.default_rng(2).standard_normal((6, 7)) * 0.3
    cases = [
        {"prior": "zero"},
        {"prior": "identity", "prior_weight": 0.3},
        {"prior": "matrix", "prior_weight": 0.7, "W0": W0},
        {"prior": "identity", "prior_weight": 0.6, "kernel": "rbf"},
    ]
    for case in cases:
        est = MMDTL2(**case).fit_domains(Xs, ys, Xt, yt)
        prob = GramProblem.from_features(Xs, ys, Xt, yt, Xq, W0=case.get("W0"))
        core = {k: v for k, v in case.items() if k != "W0"}
        assert est.objective_ == fit_predict("mmdtl2", core, prob).info["objective"], case
    grid = [{"prior_weight": w, "c_f": c} for w in (0.0, 0.5) for c in (0.1, 1.0)]
    est = MMDTL2(prior="identity", select=grid).fit_domains(Xs, ys, Xt, yt)
    base = {**default_params("mmdtl2"), "prior": "identity"}
    c = choose("mmdtl2", base, GramProblem.from_features(Xs, ys, Xt, yt, Xq), grid)
    assert est.selection_ == c.table and est.selected_params_ == c.chosen


def test_mmdt_pickled_by_the_explicit_w_version_asks_for_a_refit():
    """An MMDT pickled before it was MMDTL2 with fixed settings (only W_, no adapter)."""
    Xs, ys, Xt, yt, Xq, _ = make_devices(1, Lt=4)
    m = MMDT().fit_domains(Xs, ys, Xt, yt)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(m)).predict(Xq), m.predict(Xq))
    old = {k: v for k, v in m.__getstate__().items() if k != "adapter_"}
    with pytest.raises(ValueError, match="fit it again"):
        MMDT.__new__(MMDT).__setstate__(old)
