"""Every method parameter described once: type, accepted values, default, meaning.

:data:`PARAMS` says what each parameter name accepts, :data:`DEFAULTS` which parameters
each method of :mod:`mmdtl2_dist.core.methods` takes and their defaults. Everything that
checks a parameter value reads them:

- the core (:func:`check_params`, called by :func:`mmdtl2_dist.core.methods.fit_predict`
  and :class:`mmdtl2_dist.core.mmdtl2.MMDTL2Params`);
- the scikit-learn estimators, whose ``__init__`` defaults and ``_parameter_constraints``
  are derived from these entries (:mod:`mmdtl2_dist.estimators`);
- the study spec (:mod:`mmdtl2_dist.study.spec`), which adds only the spelling of
  ``None`` in TOML (:attr:`Param.none_word`).

So a bad value gets one message, ``"<name> must be <what>, got <value>."``, whichever
entry point it came through. To add a parameter: add its :class:`Param` to
:data:`PARAMS` and its default to the :data:`DEFAULTS` entry of each method that takes it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Largest hinge weight (``c_s``, ``c_t``) accepted. The weights bound the dual box QPs of
#: both steps, and the larger they are, the worse those QPs are conditioned: on
#: overlapping classes the solvers fail from about 1e7 for ``c_s`` (and, for the W-step of
#: low-dimensional targets, from 1e3 for ``c_t``; such failures name the weights, see
#: :func:`mmdtl2_dist.core.mmdtl2.hinge_weights_named`). The paper uses 0.1, Hoffman et
#: al. 0.05 and 1, the bundled studies 0.05 to 1, libsvm's usual grid reaches 2^15.
HINGE_WEIGHT_MAX = 1e6
WEIGHT_ADVICE = (
    "the paper uses 0.1 for each, Hoffman et al.'s MMDT c_s = 0.05 and c_t = 1; the bundled "
    "studies keep c_s and c_t within 0.05 to 1"
)
_HINGE_TOO_LARGE = (
    f"larger hinge weights make the dual QPs too ill-conditioned to solve ({WEIGHT_ADVICE})"
)
KERNELS = ("linear", "rbf", "poly")
#: The box-QP solvers of :mod:`mmdtl2_dist.core.qp`.
SOLVERS = ("dcd", "osqp")
PRIORS = ("zero", "identity", "matrix")
INITS = ("source", "source+prior")


@dataclass(frozen=True)
class Param:
    """What one parameter accepts.

    ``kind`` is ``"real"`` (a finite real number in ``[low, high]``, an open end where
    ``low_open`` / ``high_open``), ``"int"`` (an integer ``>= low``) or ``"choice"`` (one
    of ``choices``, of the same type). ``none_word`` set means ``None`` is accepted too
    and is spelt so in a study spec (TOML has no null). ``above_high`` is the reason a
    number above ``high`` is refused, added to the message.
    """

    kind: str
    doc: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    none_word: str | None = None
    above_high: str = ""

    def expect(self) -> str:
        """The accepted values in words (the ``<what>`` of the error message)."""
        if self.kind == "choice":
            text = f"one of {self.choices}"
        elif self.kind == "int":
            text = "a positive integer" if self.low == 1 else f"an integer >= {self.low:g}"
        elif self.high < math.inf:
            text = f"a positive number of at most {self.high:g}"
        elif self.low == 0:
            text = "a positive finite number" if self.low_open else "a non-negative finite number"
        else:
            text = "a finite number"
        if self.none_word is not None:
            text += f' or None (written "{self.none_word}" in a study spec)'
        return text

    def accepts(self, v: Any) -> bool:
        """Whether ``v`` is an accepted value."""
        if v is None:
            return self.none_word is not None
        if self.kind == "choice":
            return any(v == c and type(v) is type(c) for c in self.choices)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            return False
        if self.kind == "int" and not isinstance(v, numbers.Integral):
            return False
        above = v > self.high or (self.high_open and v == self.high)
        below = v < self.low or (self.low_open and v == self.low)
        return not (above or below)

    def refusal(self, name: str, v: Any) -> str:
        """The message for a refused value ``v`` of parameter ``name``."""
        is_num = isinstance(v, numbers.Real) and not isinstance(v, bool)
        got = f"{float(v):g}" if is_num and self.kind == "real" else repr(v)
        why = f"; {self.above_high}" if self.above_high and is_num and v > self.high else ""
        return f"{name} must be {self.expect()}, got {got}{why}."


def positive(doc: str, **kw) -> Param:
    """A real number > 0 (more bounds in ``kw``)."""
    return Param("real", doc, low=0.0, low_open=True, **kw)


def count(doc: str, **kw) -> Param:
    """An integer >= 1."""
    return Param("int", doc, low=1, **kw)


def _hinge(doc: str) -> Param:
    return positive(doc, high=HINGE_WEIGHT_MAX, above_high=_HINGE_TOO_LARGE)


#: What every parameter name accepts (a method may override one, :data:`METHOD_PARAMS`).
PARAMS: dict[str, Param] = {
    "c_f": positive("weight of ½‖W − W0‖² (1 with c_d = 0 is MMDT)"),
    "c_d": Param("real", "weight of the L2 pull of same-class targets to sources", low=0.0),
    "c_t": _hinge("target hinge weight (both steps)"),
    "c_s": _hinge("source hinge weight (SVM-step)"),
    "max_iter": count("maximum number of alternations (W-step + SVM-step)"),
    "tol": Param("real", "stop at a relative objective decrease below tol (0: never)", low=0.0),
    "qp_solver": Param("choice", "box-QP solver of both steps", choices=SOLVERS),
    "qp_tol": positive("relative KKT tolerance of every QP"),
    "kernel": Param("choice", "target-side kernel", choices=KERNELS),
    "gamma": positive("kernel scale (None: from the training Gram)", none_word="auto"),
    "degree": count("degree of the polynomial kernel"),
    "coef0": Param("real", "constant of the polynomial kernel", low=0.0),
    "prior": Param("choice", "prior transform W0 of ½ c_f ‖W − W0‖²", choices=PRIORS),
    "prior_weight": Param("real", "mixing weight μ of the prior (μ I or μ W0)", low=0.0),
    "init": Param("choice", "initial SVM: source only or with prior-mapped targets", choices=INITS),
    "n_iter": count("number of W-steps"),
    "pca_dim": count("transductive PCA dimension (None: no PCA)", none_word="none"),
    "bregman_tol": positive("stop the Bregman projections at this constraint violation"),
    "check_every": count("Bregman projections between convergence checks"),
    "max_steps": count("largest number of Bregman projections"),
    "faithful": Param("choice", "keep the reference code's quirks", choices=(True, False)),
}
#: Where one name means something else in one method.
METHOD_PARAMS: dict[str, dict[str, Param]] = {
    "mmdt_hoffman": {"gamma": positive("W-step slack weight γ of the reference code")},
}

#: The parameters of each method and their defaults.
DEFAULTS: dict[str, dict] = {
    "source_svm": {"c_s": 1.0, "c_t": 1.0, "qp_solver": "dcd", "qp_tol": 1e-8},
    "target_svm": {"c_t": 1.0, "qp_solver": "dcd", "qp_tol": 1e-8},
    "mmdt": {
        "c_t": 1.0, "c_s": 0.05, "max_iter": 20, "tol": 1e-5, "qp_solver": "dcd", "qp_tol": 1e-8,
    },
    "mmdt_hoffman": {
        "c_s": 0.05, "c_t": 1.0, "gamma": 1e-4, "n_iter": 2, "pca_dim": 20,
        "bregman_tol": 0.01, "check_every": 1000, "max_steps": 1_000_000, "faithful": True,
        "qp_solver": "dcd", "qp_tol": 1e-8,
    },
    "mmdtl2": {
        "c_f": 0.1, "c_d": 0.1, "c_t": 0.1, "c_s": 0.1, "max_iter": 20, "tol": 1e-5,
        "qp_solver": "dcd", "qp_tol": 1e-8, "kernel": "linear", "gamma": None, "degree": 2,
        "coef0": 1.0, "prior": "zero", "prior_weight": 1.0, "init": "source",
    },
}  # fmt: skip
METHODS = tuple(DEFAULTS)
#: What makes MMDTL2 the paper's MMDT (its Problem 2): ``½‖W‖²`` with weight 1, no L2
#: constraint term, the linear kernel, the zero prior and a source-only start. ``mmdt`` is
#: MMDTL2 with these fixed and :data:`DEFAULTS` ``["mmdt"]`` (Hoffman et al.'s weights).
MMDT_FIXED: dict = {
    "c_f": 1.0, "c_d": 0.0, "kernel": "linear", "gamma": None, "degree": 2, "coef0": 1.0,
    "prior": "zero", "prior_weight": 1.0, "init": "source",
}  # fmt: skip


def mmdt_as_mmdtl2(params: Mapping) -> dict:
    """The MMDTL2 parameters of the ``mmdt`` parameters ``params``."""
    return {**DEFAULTS["mmdtl2"], **params, **MMDT_FIXED}


def check_method(method: str) -> None:
    """Raise ValueError unless ``method`` is one of :data:`METHODS`."""
    if method not in DEFAULTS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}.")


def method_params(method: str) -> dict[str, Param]:
    """The :class:`Param` of every parameter of ``method``."""
    check_method(method)
    over = METHOD_PARAMS.get(method, {})
    return {k: over.get(k, PARAMS[k]) for k in DEFAULTS[method]}


def check_names(method: str, names: Iterable[str]) -> None:
    """Raise ValueError naming the parameters ``method`` does not take, and those it does."""
    check_method(method)
    valid = DEFAULTS[method]
    bad = sorted(set(names) - set(valid))
    if bad:
        fixed = sorted(set(bad) & set(MMDT_FIXED)) if method == "mmdt" else []
        hint = (
            f" MMDT fixes {fixed} (it is MMDTL2 with c_f = 1, c_d = 0, the linear kernel and "
            "the zero prior): use method 'mmdtl2' to set them."
            if fixed
            else ""
        )
        raise ValueError(
            f"method {method!r} has no parameter {', '.join(map(repr, bad))}; "
            f"its parameters are {sorted(valid)}.{hint}"
        )


def check_params(method: str, params: Mapping) -> None:
    """Check every name and value of ``params`` for ``method``; ValueError naming the fix."""
    specs = method_params(method)
    check_names(method, params)
    for name, value in params.items():
        if not specs[name].accepts(value):
            raise ValueError(specs[name].refusal(name, value))


def check_values(params: Mapping) -> None:
    """Check the values of the generic parameters found in ``params`` (others are skipped).

    For callers below the method level (:class:`~mmdtl2_dist.core.mmdtl2.MMDTL2Params`,
    the estimators), where every name has its :data:`PARAMS` meaning.
    """
    for name, value in params.items():
        if name in PARAMS and not PARAMS[name].accepts(value):
            raise ValueError(PARAMS[name].refusal(name, value))
