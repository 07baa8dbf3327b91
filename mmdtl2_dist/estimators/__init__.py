"""scikit-learn estimators: MMDTL2, MMDT (paper and reference-code forms), source/target SVM.

How domains are passed
----------------------
Two ways:

1. ``fit(X, y, sample_domain=...)`` — skada's convention: one array ``X`` whose rows are
   source samples where ``sample_domain > 0`` and labelled target samples where
   ``sample_domain < 0`` (keyword only, as in skada's adapters). This needs one feature
   dimension for both devices. The methods adapt **one** source domain to **one** target
   domain: several positive (or several negative) ids are refused, naming the ids
   found. A target row labelled ``-1`` is skada's mark for an unlabelled target sample
   (skada's pipelines put it on every target row unless ``mask_target_labels=False``):
   :class:`MMDTL2` takes such rows as unlabelled target samples (``Xt_unlabelled``
   below); the other methods cannot use them and refuse them, naming the fix. ``-1`` is
   never read as a class there.
2. ``fit_domains(Xs, ys, Xt, yt)`` — separate labelled arrays, so the source and target
   feature dimensions may differ (conv3 64,896-d source, conv5 43,264-d target). Every
   label is a class here, ``-1`` included. :class:`MMDTL2` also takes
   ``Xt_unlabelled``, target samples without labels.

Without ``sample_domain``, ``fit(X, y)`` of an adaptation method (:class:`MMDTL2`,
:class:`MMDT`, :class:`MMDTHoffman`) is refused with a message showing both calls:
nothing says which rows come from which device, and using every row as both source and
target would quietly fit a model with no device shift to adapt to. The single-domain
baselines are plain classifiers there: :class:`SourceSVM` reads every row as a source
sample (skada infers the same for labels other than ``-1``) and :class:`TargetSVM` every
row as a labelled target sample; both read ``-1`` as a class, as scikit-learn does.

``predict``, ``decision_function``, ``score`` and ``transform`` take **target-device**
samples (the device being adapted to). With ``sample_domain`` (keyword only), rows with
a positive domain are scored by the source classifier instead (same feature space only).
The ``sample_domain`` of every method is requested for scikit-learn's metadata routing by
default, as skada's estimators request it, so skada pipelines pass it on.

Preprocessing (``preprocessing=``) is fitted per device on the samples given to ``fit``
(source rows and target rows separately; the target statistics over the labelled and the
unlabelled target samples) and frozen; see
:mod:`mmdtl2_dist.core.preprocessing` for why per-device statistics are used. The
preprocessed features of each device must have squared norms that float64 can hold beside
the bias constant 1 (:func:`~mmdtl2_dist.core.preprocessing.check_scale`); ``"l2"`` and
``"l2_zscore"`` are scale-free, ``"none"`` is not.

``fit``, ``fit_domains``, ``predict``, ``decision_function``, ``score`` and ``transform``
run with one BLAS/OpenMP thread (:mod:`mmdtl2_dist.core.threads`).
"""

from mmdtl2_dist.estimators.base import MAX_EXPLICIT_W, parameter_constraints
from mmdtl2_dist.estimators.inputs import domain_masks, split_domains, unlabelled_target_rows
from mmdtl2_dist.estimators.mmdt import MMDT, MMDTHoffman
from mmdtl2_dist.estimators.mmdtl2 import MMDTL2
from mmdtl2_dist.estimators.svm import SourceSVM, TargetSVM

__all__ = [
    "MAX_EXPLICIT_W",
    "MMDT",
    "MMDTL2",
    "MMDTHoffman",
    "SourceSVM",
    "TargetSVM",
    "domain_masks",
    "parameter_constraints",
    "split_domains",
    "unlabelled_target_rows",
]
