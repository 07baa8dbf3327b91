"""Study specifications: a TOML or YAML file, validated with errors that say how to fix it.

A study names a feature store (or a bundled / synthetic data set), the device pairs and
feature spaces, the methods with their parameters and grids, the labelled target samples
per class, how splits are drawn, and where results go. Example (TOML)::

    [study]
    name = "nbi_conv3"
    seed = 0
    output = "runs/nbi_conv3"          # optional; default ./mmdtl2-studies/<name>

    [data]
    store = "features.zarr"            # relative to the spec file
    source_space = "conv3"
    target_space = "conv3"             # another space for heterogeneous features
    pairs = [["lucera", "elite"]]      # [source device, target device]; or "all"
    preprocessing = "l2_zscore"        # none | l2 | zscore | l2_zscore (per device)
    gram_dir = "/shared/grams"         # optional; default <store>.grams beside the store

    [gram]                             # optional
    precision = "float64"              # float64 (exact) | mixed (float32 products)

    [splits]
    protocol = "half"                  # half | group | fixed
    n_splits = 10
    train_fraction = 0.5
    samples_per_class = [1, 2, 3, 4, 5, 10, 15, 20, 25, 30, 35, 40]
    unlabelled = "non-test"            # non-test | all | none | { groups = [...] }: the pool

    [[methods]]
    label = "MMDTL2 (RBF)"
    method = "mmdtl2"
    params = { kernel = "rbf", c_f = 0.1, c_d = 0.1, c_t = 0.1, c_s = 0.1 }
    grid = { c_f = [1e-8, 1e-4, 0.1, 10] }     # optional sweep: one column per value
    select = { c_d = [0.01, 0.1, 1] }          # optional: choose by CV on target train

    [[methods]]
    label = "MMDTL2 auto"
    method = "mmdtl2"
    select = "auto"                    # the frozen rule of mmdtl2_dist.core.auto
    unlabelled = "all"                 # optional: this method's pool ([splits] unlabelled)

``unlabelled`` names the target samples that the methods using unlabelled samples see
(``select = "auto"``'s prior pool and the skada baselines): ``"non-test"`` (default)
every target sample of the device outside the test set, ``"all"`` also the test samples'
features (never their labels: the transductive protocol of the published methods),
``"none"`` the labelled ones only; a table ``{ groups = ["session_7", "session_8"] }``
(optionally ``mode = "all"``) keeps the samples of that mode in the named groups of the
store's group column, with the labelled ones (:mod:`mmdtl2_dist.study.pools`). Samples
labelled -1 in the store are unlabelled: the splits are drawn over the labelled samples
(the same splits as the store without the unlabelled ones), the unlabelled target samples
join the pools, the unlabelled source samples are left out. With split files that list
only the labelled and the test samples (Hoffman's), ``"non-test"`` is the labelled
samples and the device's unlabelled ones.

See ``studies/*.toml`` for complete studies and :func:`load_spec` for every key; the JSON
Schema of every key (:mod:`mmdtl2_dist.study.spec_schema`, printed by ``mmdtl2 study
schema``) is checked first, then the rules across keys and against the files.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmdtl2_dist.core.evaluate import expand_grid
from mmdtl2_dist.core.methods import NEEDS_SHARED_SPACE
from mmdtl2_dist.core.params import DEFAULTS as CORE_DEFAULTS
from mmdtl2_dist.core.params import PARAMS, Param, check_params, count, positive
from mmdtl2_dist.study.baselines import METHODS as BASELINES
from mmdtl2_dist.study.pools import DEFAULT_POOL, POOL_MODES

#: The paper's methods, run by the core (:func:`mmdtl2_dist.core.methods.fit_predict`).
CORE_METHODS = tuple(CORE_DEFAULTS)
#: Established shallow methods from skada, on the same splits (see study.baselines).
EXTRA_METHODS = BASELINES
ALL_METHODS = CORE_METHODS + EXTRA_METHODS
#: Methods that need source and target in one feature space.
SAME_SPACE_METHODS = (*sorted(NEEDS_SHARED_SPACE), *EXTRA_METHODS)
_SVM_C = positive("hinge weight of the SVM")
#: Parameters of the skada baselines (their values as skada takes them; ``reg = "auto"`` is
#: skada's own default).
EXTRA_PARAMS: dict[str, dict[str, Param]] = {
    "coral_svm": {"reg": positive("CORAL regulariser", none_word="auto"), "c": _SVM_C},
    "sa_svm": {"n_components": count("subspace dimension"), "c": _SVM_C},
    "kmm_svm": {
        "kmm_gamma": positive("KMM kernel width"),
        "kmm_B": positive("KMM weight bound"),
        "c": _SVM_C,
    },
}
#: Spec spellings of the core's ``None`` (TOML has no null).
NONE_WORDS = {k: p.none_word for k, p in PARAMS.items() if p.none_word is not None}
BUILTIN_DATA = ("office_caltech10",)
#: Which unlabelled target samples the methods that use them see (``select = "auto"``'s
#: prior pool, the skada baselines' target samples): every non-test sample of the target
#: device (inductive), also the test samples (transductive) or none.
UNLABELLED_POOLS = POOL_MODES
DEFAULT_OUTPUT_ROOT = "mmdtl2-studies"
PRIOR_MATRIX = (
    "prior = 'matrix' needs a map W0, which a study spec cannot give; use 'zero' or "
    "'identity' (or the estimator MMDTL2(prior='matrix', W0=...))."
)


class SpecError(ValueError):
    """A study spec is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class MethodSpec:
    """One method entry: a column of the report (or one column per grid point)."""

    label: str
    method: str
    params: dict[str, Any]
    grid: dict[str, list]
    select: dict[str, list] | str
    unlabelled: str | dict | None = None


@dataclass(frozen=True)
class MethodConfig:
    """One concrete configuration of a method (a grid point)."""

    label: str
    method: str
    params: dict[str, Any]
    select: dict[str, list] | str
    base_label: str
    swept: dict[str, Any]
    unlabelled: str | dict | None = None


@dataclass(frozen=True)
class TrialSpec:
    """One Tune trial: a method configuration at one number of labelled samples per class.

    A trial is evaluated over every device pair and every split of the study.
    """

    key: str
    config: MethodConfig
    n_per_class: int
    unlabelled: str | dict = DEFAULT_POOL

    def to_dict(self) -> dict:
        c = self.config
        return {
            "key": self.key,
            "label": c.label,
            "method": c.method,
            "params": c.params,
            "select": c.select,
            "base_label": c.base_label,
            "swept": c.swept,
            "n_per_class": self.n_per_class,
            "unlabelled": self.unlabelled,
        }


@dataclass(frozen=True)
class StudySpec:
    """A validated study specification (see the module docstring)."""

    path: Path | None
    raw: dict
    name: str
    seed: int
    output: Path
    description: str
    store: Path | None
    builtin: str | None
    synthetic: dict | None
    preprocessing: str
    source_space: str
    target_space: str
    pairs: list[tuple[str, str]] | str
    protocol: str
    n_splits: int
    train_fraction: float
    split_file: Path | None
    source_per_class: int | None
    samples_per_class: list[int]
    methods: list[MethodSpec]
    unlabelled: str | dict = DEFAULT_POOL
    cpus_per_trial: float = 1.0
    split_tasks: int = 0
    max_concurrent_trials: int = 0
    gram_dir: Path | None = None
    gram_precision: str = "float64"
    tracking_uri: str | None = None
    experiment: str | None = None
    reference_source: str | None = None
    reference_target: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def shared_space(self) -> bool:
        return self.source_space == self.target_space

    def configs(self) -> list[MethodConfig]:
        """Every method configuration (grids expanded), in spec order."""
        return expand_configs(self.methods)

    def trials(self) -> list[TrialSpec]:
        """Every trial: configuration x labelled samples per class."""
        out = []
        for c in self.configs():
            for n in self.samples_per_class:
                pool = c.unlabelled or self.unlabelled
                out.append(TrialSpec(trial_key(c, n, pool), c, n, pool))
        return out

    def fingerprint(self) -> str:
        """A hash of the spec's content (identifies a study across runs and resumes)."""
        return hashlib.sha256(
            json.dumps(self.raw, sort_keys=True, default=str).encode()
        ).hexdigest()[:16]


def expand_configs(methods: list[MethodSpec]) -> list[MethodConfig]:
    """Expand each method's grid into configurations, labelled ``label [k=v, ...]``."""
    out = []
    for m in methods:
        for swept in expand_grid({}, m.grid):
            label = m.label
            if swept:
                label += " [" + ", ".join(f"{k}={_fmt(v)}" for k, v in swept.items()) + "]"
            out.append(
                MethodConfig(
                    label, m.method, {**m.params, **swept}, m.select, m.label, swept, m.unlabelled
                )
            )
    return out


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def trial_key(config: MethodConfig, n_per_class: int, unlabelled: str | dict = DEFAULT_POOL) -> str:
    """A deterministic key of a trial (its MLflow tag and result file name).

    The unlabelled pool enters the key only when it is not the default ``"non-test"``,
    so spelling out the default does not change a study's keys. A ``select = "auto"``
    trial's key holds the rule's version, so a study resumed under another version of
    the rule runs the trial again instead of mixing the two versions' results.
    """
    parts = [config.label, config.method, config.params, config.select, n_per_class]
    if unlabelled != DEFAULT_POOL:
        parts.append(unlabelled)
    if config.select == "auto":
        from mmdtl2_dist.core.auto import AUTO_RULE

        parts.append(AUTO_RULE)
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _err(where: str, msg: str) -> SpecError:
    """An error in the spec's section ``where``, or in the command-line flag ``where``."""
    return SpecError(
        f"{where}: {msg}" if where.startswith("--") else f"study spec: [{where}] {msg}"
    )


def core_params(params: dict) -> dict:
    """Spec parameter values as the core takes them (``"auto"``/``"none"`` -> ``None``)."""
    return {k: None if NONE_WORDS.get(k) == v else v for k, v in params.items()}


def check_param(where: str, method: str, name: str, value: Any) -> None:
    """Validate one method parameter value; raise :class:`SpecError` naming the fix.

    The core's methods are checked by the core (:func:`mmdtl2_dist.core.params.check_params`,
    the same message as the estimators give), after the spec's spelling of ``None``.
    """
    if method in EXTRA_PARAMS:
        specs = EXTRA_PARAMS[method]
        if name not in specs:
            raise _err(
                where, f"method {method!r} has no parameter {name!r}; its parameters are "
                f"{sorted(specs)}."
            )  # fmt: skip
        v = None if value == specs[name].none_word else value
        if not specs[name].accepts(v):
            raise _err(where, specs[name].refusal(name, value))
        return
    try:
        check_params(method, core_params({name: value}))
    except ValueError as e:
        raise _err(where, str(e)) from None
    if name == "prior" and value == "matrix":
        raise _err(where, PRIOR_MATRIX)


def parse_spec(raw: dict, path: Path | None = None, output: str | Path | None = None) -> StudySpec:
    """Validate a spec given as a dict (the parsed TOML/YAML).

    Parameters
    ----------
    raw : dict
        Parsed file content.
    path : Path, optional
        The spec file (relative ``store`` and ``file`` paths are resolved against its
        folder).
    output : str or Path, optional
        Overrides ``[study] output``.

    Raises
    ------
    SpecError
        With the offending key and how to fix it.
    """
    from mmdtl2_dist.study import spec_sections as sections
    from mmdtl2_dist.study.spec_schema import check_schema

    check_schema(raw)
    base = path.parent if path is not None else None
    fields = {**sections.study_section(raw, output), **sections.data_section(raw, base)}
    fields.update(sections.splits_section(raw, base, fields["builtin"]))
    fields["methods"] = sections.methods_section(raw["methods"])
    sections.check_methods_fit_data(fields)
    fields.update(sections.execution_section(raw), gram_precision=sections.gram_precision(raw))
    labels = {c.label for c in expand_configs(fields["methods"])}
    fields.update(sections.tracking_section(raw), **sections.report_section(raw, labels))
    return StudySpec(path=path, raw=raw, **fields)


def load_spec(path: str | Path, output: str | Path | None = None) -> StudySpec:
    """Read and validate a study spec file (``.toml``, ``.yaml`` or ``.yml``).

    Parameters
    ----------
    path : str or Path
        The spec file.
    output : str or Path, optional
        Overrides ``[study] output``.
    """
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise SpecError(
            f"study spec {str(path)!r} not found; pass the path of a .toml or "
            ".yaml file (bundled studies are in the repository's studies/)."
        )
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            raw = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text)
        else:
            raise SpecError(f"study spec {p.name!r}: use a .toml, .yaml or .yml file.")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise SpecError(
            f"study spec {p.name!r} is not valid {p.suffix[1:].upper()}: {exc}"
        ) from exc
    return parse_spec(raw, p, output)
