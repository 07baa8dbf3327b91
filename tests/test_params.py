"""One description of the method parameters (mmdtl2_dist.core.params), three entry points.

A bad value reaches the core through ``fit_predict``, the scikit-learn estimators and a
study spec; each must refuse it with the one message the parameter table gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError, validate_parameter_constraints

from mmdtl2_dist.core.methods import GramProblem, fit_predict
from mmdtl2_dist.core.params import DEFAULTS, METHODS, method_params
from mmdtl2_dist.estimators import MMDT, MMDTL2, MMDTHoffman, SourceSVM, TargetSVM
from mmdtl2_dist.study.spec import SpecError, parse_spec

ESTIMATORS = {
    "mmdtl2": MMDTL2,
    "mmdt": MMDT,
    "mmdt_hoffman": MMDTHoffman,
    "source_svm": SourceSVM,
    "target_svm": TargetSVM,
}
# (method, parameter, bad value, the message every entry point gives)
BAD = [
    ("mmdtl2", "c_f", 0.0, "c_f must be a positive finite number, got 0."),
    ("mmdtl2", "c_d", -0.5, "c_d must be a non-negative finite number, got -0.5."),
    ("mmdtl2", "kernel", "sigmoid",
     "kernel must be one of ('linear', 'rbf', 'poly'), got 'sigmoid'."),
    ("mmdtl2", "degree", 0, "degree must be a positive integer, got 0."),
    ("mmdtl2", "coef0", -1.0, "coef0 must be a non-negative finite number, got -1."),
    ("mmdtl2", "max_iter", 2.5, "max_iter must be a positive integer, got 2.5."),
    ("mmdtl2", "init", "target", "init must be one of ('source', 'source+prior'), got 'target'."),
    ("mmdt", "qp_tol", -1e-8, "qp_tol must be a positive finite number, got -1e-08."),
    ("mmdt_hoffman", "n_iter", 0, "n_iter must be a positive integer, got 0."),
    ("mmdt_hoffman", "pca_dim", 0,
     'pca_dim must be a positive integer or None (written "none" in a study spec), got 0.'),
    ("source_svm", "c_s", 1e12,
     "c_s must be a positive number of at most 1e+06, got 1e+12; larger hinge weights"),
    ("target_svm", "qp_solver", "cvx", "qp_solver must be one of"),
]  # fmt: skip


def _problem():
    rng = np.random.default_rng(0)
    Xs, Xt, Xq = rng.normal(size=(12, 4)), rng.normal(size=(6, 4)), rng.normal(size=(3, 4))
    ys, yt = np.repeat([0, 1], 6), np.repeat([0, 1], 3)
    return Xs, ys, Xt, yt, Xq


def _problem_blocks():
    Xs, ys, Xt, yt, Xq = _problem()
    return GramProblem.from_features(Xs, ys, Xt, yt, Xq)


def _spec(method, params):
    return {
        "study": {"name": "t"},
        "data": {"synthetic": {}, "space": "s", "pairs": [["a", "b"]]},
        "splits": {"samples_per_class": [1]},
        "methods": [{"method": method, "params": params}],
    }


@pytest.mark.parametrize(("method", "name", "value", "message"), BAD)
def test_bad_value_gets_one_message_from_core_estimator_and_spec(method, name, value, message):
    Xs, ys, Xt, yt, Xq = _problem()
    with pytest.raises(ValueError) as core:
        fit_predict(method, {name: value}, GramProblem.from_features(Xs, ys, Xt, yt, Xq))
    assert str(core.value).startswith(message)
    Est = ESTIMATORS[method]
    if name in Est._get_param_names():
        with pytest.raises(ValueError) as est:
            Est(**{name: value}).fit_domains(Xs, ys, Xt, yt)
        assert str(est.value) == str(core.value)
    with pytest.raises(SpecError) as spec:
        parse_spec(_spec(method, {name: value}))
    assert str(spec.value) == f"study spec: [methods #1] {core.value}"


@pytest.mark.parametrize("method", METHODS)
def test_unknown_parameter_named_alike_by_core_and_spec(method):
    Xs, ys, Xt, yt, Xq = _problem()
    with pytest.raises(ValueError, match="has no parameter 'c_q'") as core:
        fit_predict(method, {"c_q": 1.0}, GramProblem.from_features(Xs, ys, Xt, yt, Xq))
    with pytest.raises(SpecError) as spec:
        parse_spec(_spec(method, {"c_q": 1.0}))
    assert str(spec.value) == f"study spec: [methods #1] {core.value}"
    if method in ("mmdtl2", "mmdt"):  # deployable: `mmdtl2 register --param c_q=1`
        from mmdtl2_dist.deploy.training import _full_params

        with pytest.raises(ValueError) as deploy:
            _full_params(method, {"c_q": 1.0})
        assert str(deploy.value) == str(core.value)
    if method == "mmdt":  # what MMDT fixes is named, with the method that sets it
        with pytest.raises(ValueError, match=r"MMDT fixes \['c_d', 'c_f'\] .* method 'mmdtl2'"):
            fit_predict(method, {"c_f": 0.5, "c_d": 1.0}, _problem_blocks())
    if method == "mmdtl2":  # a grid of the estimator's select
        with pytest.raises(ValueError) as est:
            MMDTL2(select=[{"c_q": 1.0}]).fit_domains(Xs, ys, Xt, yt)
        assert str(est.value) == str(core.value)


@pytest.mark.parametrize(("method", "name", "value", "message"), BAD)
def test_sklearn_constraints_refuse_what_the_core_refuses(method, name, value, message):
    """The estimators' ``_parameter_constraints`` are derived from the same table."""
    Est = ESTIMATORS[method]
    if name not in Est._get_param_names():
        pytest.skip(f"{Est.__name__} does not expose {name}")
    good = Est().get_params()
    validate_parameter_constraints(Est._parameter_constraints, good, Est.__name__)
    with pytest.raises(InvalidParameterError):
        validate_parameter_constraints(
            Est._parameter_constraints, {**good, name: value}, Est.__name__
        )


@pytest.mark.parametrize("method", METHODS)
def test_estimator_defaults_and_constraints_come_from_the_table(method):
    Est = ESTIMATORS[method]
    params = Est().get_params()
    shared = set(params) & set(DEFAULTS[method])
    assert {k: params[k] for k in shared} == {k: DEFAULTS[method][k] for k in shared}
    assert set(Est._parameter_constraints) == set(params)
    assert shared <= set(method_params(method))


def test_spec_none_words_reach_the_core_as_none():
    from mmdtl2_dist.study.spec import core_params

    assert core_params({"gamma": "auto", "pca_dim": "none", "c_f": 1.0}) == {
        "gamma": None,
        "pca_dim": None,
        "c_f": 1.0,
    }
    parse_spec(_spec("mmdtl2", {"gamma": "auto"}))
    parse_spec(_spec("mmdt_hoffman", {"pca_dim": "none"}))
    with pytest.raises(SpecError, match="needs a map W0"):
        parse_spec(_spec("mmdtl2", {"prior": "matrix"}))
