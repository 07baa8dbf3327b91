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
    unlabelled = "non-test"            # non-test | all | none: the unlabelled target pool

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
``"none"`` the labelled ones only. With split files that list only the labelled and the
test samples (Hoffman's), ``"non-test"`` is the labelled samples.

See ``studies/*.toml`` for complete studies and :func:`load_spec` for every key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmdtl2_dist.core.methods import NEEDS_SHARED_SPACE
from mmdtl2_dist.core.params import DEFAULTS as CORE_DEFAULTS
from mmdtl2_dist.core.params import PARAMS, Param, check_params, count, positive
from mmdtl2_dist.core.preprocessing import DEFAULT_PREPROCESSING, PREPROCESSING
from mmdtl2_dist.engine.products import PRECISIONS as GRAM_PRECISIONS
from mmdtl2_dist.study.splits import PROTOCOLS

#: The paper's methods, run by the core (:func:`mmdtl2_dist.core.methods.fit_predict`).
CORE_METHODS = tuple(CORE_DEFAULTS)
#: Established shallow methods from skada, on the same splits (see study.baselines).
EXTRA_METHODS = ("coral_svm", "sa_svm", "kmm_svm")
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
UNLABELLED_POOLS = ("non-test", "all", "none")
DEFAULT_OUTPUT_ROOT = "mmdtl2-studies"


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
    unlabelled: str | None = None


@dataclass(frozen=True)
class MethodConfig:
    """One concrete configuration of a method (a grid point)."""

    label: str
    method: str
    params: dict[str, Any]
    select: dict[str, list] | str
    base_label: str
    swept: dict[str, Any]
    unlabelled: str | None = None


@dataclass(frozen=True)
class TrialSpec:
    """One Tune trial: a method configuration at one number of labelled samples per class.

    A trial is evaluated over every device pair and every split of the study.
    """

    key: str
    config: MethodConfig
    n_per_class: int
    unlabelled: str = "non-test"

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
    unlabelled: str = "non-test"
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
        names = list(m.grid)
        for values in itertools.product(*(m.grid[n] for n in names)):
            swept = dict(zip(names, values, strict=True))
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


def trial_key(config: MethodConfig, n_per_class: int, unlabelled: str = "non-test") -> str:
    """A deterministic key of a trial (its MLflow tag and result file name).

    The unlabelled pool enters the key only when it is not the default ``"non-test"``,
    so spelling out the default does not change a study's keys.
    """
    parts = [config.label, config.method, config.params, config.select, n_per_class]
    if unlabelled != "non-test":
        parts.append(unlabelled)
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _err(where: str, msg: str) -> SpecError:
    return SpecError(f"study spec: [{where}] {msg}")


def _table(raw: dict, name: str, required: bool = False) -> dict:
    t = raw.get(name)
    if t is None:
        if required:
            raise _err(name, f"missing table; add a [{name}] section.")
        return {}
    if not isinstance(t, dict):
        raise _err(name, f"must be a table, got {type(t).__name__}.")
    return t


def _check_keys(where: str, table: dict, allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _err(where, f"unknown key(s) {unknown}; allowed keys are {sorted(allowed)}.")


def _int(where: str, key: str, v: Any, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(where, f"{key} must be an integer >= {minimum}, got {v!r}.")
    return v


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
        raise _err(
            where,
            "prior = 'matrix' needs a map W0, which a study spec cannot give; use 'zero' or "
            "'identity' (or the estimator MMDTL2(prior='matrix', W0=...)).",
        )


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _grid(where: str, method: str, g: Any, what: str) -> dict[str, list]:
    if g is None:
        return {}
    if not isinstance(g, dict):
        raise _err(where, f"{what} must be a table of parameter = [values], got {g!r}.")
    out = {}
    for k, vals in g.items():
        if not isinstance(vals, list) or not vals:
            raise _err(
                where,
                f"{what}.{k} must be a non-empty list of values, got {vals!r}; "
                f"write {k} = [value1, value2].",
            )
        if len(set(map(repr, vals))) != len(vals):
            raise _err(where, f"{what}.{k} repeats a value: {vals!r}.")
        for v in vals:
            check_param(where, method, k, v)
        out[k] = list(vals)
    return out


def _methods(raw: Any) -> list[MethodSpec]:
    if not isinstance(raw, list) or not raw:
        raise _err(
            "methods",
            'at least one [[methods]] entry is needed, e.g. [[methods]] method = "mmdtl2".',
        )
    out, labels = [], set()
    for i, m in enumerate(raw):
        where = f"methods #{i + 1}"
        if not isinstance(m, dict):
            raise _err(where, "each method must be a table.")
        _check_keys(where, m, {"label", "method", "params", "grid", "select", "unlabelled"})
        method = m.get("method")
        if method not in ALL_METHODS:
            raise _err(where, f"unknown method {method!r}; choose one of {ALL_METHODS}.")
        label = str(m.get("label", method))
        if label in labels:
            raise _err(
                where, f"label {label!r} is used twice; give each method entry a distinct label."
            )
        labels.add(label)
        params = m.get("params", {}) or {}
        if not isinstance(params, dict):
            raise _err(where, f"params must be a table, got {params!r}.")
        for k, v in params.items():
            check_param(where, method, k, v)
        grid = _grid(where, method, m.get("grid"), "grid")
        if m.get("select") == "auto":
            _check_auto(where, method, {**params, **grid})
            select = "auto"
        else:
            select = _grid(where, method, m.get("select"), "select")
        both = sorted(set(grid) & set(select if isinstance(select, dict) else {}))
        if both:
            raise _err(
                where,
                f"{both} are both swept (grid) and selected (select); keep "
                "each parameter in one of them.",
            )
        if select and method in EXTRA_METHODS:
            raise _err(
                where,
                f"select (cross-validation) is offered for the core methods "
                f"{CORE_METHODS}, not {method!r}.",
            )
        unlabelled = m.get("unlabelled")
        if unlabelled is not None:
            unlabelled = _unlabelled(where, unlabelled)
        out.append(MethodSpec(label, method, dict(params), grid, select, unlabelled))
    return out


def _check_auto(where: str, method: str, params: dict) -> None:
    """``select = "auto"``: MMDTL2 only, and the rule's own parameters left to it."""
    from mmdtl2_dist.core.auto import RULE_KEYS

    if method != "mmdtl2":
        raise _err(where, f'select = "auto" is a rule for method "mmdtl2", not {method!r}.')
    fixed = sorted(set(params) & set(RULE_KEYS))
    if fixed:
        raise _err(
            where,
            f'select = "auto" chooses {list(RULE_KEYS)} itself; remove {fixed} from '
            "params and grid.",
        )


def _unlabelled(where: str, value: Any) -> str:
    """The unlabelled target pool: ``"non-test"``, ``"all"`` or ``"none"``."""
    if value not in UNLABELLED_POOLS:
        raise _err(
            where,
            f'unlabelled must be one of {UNLABELLED_POOLS}, got {value!r}: "non-test" '
            '(every target sample of the device outside the test set), "all" (also the '
            "test samples' features, never their labels: the transductive protocol) or "
            '"none" (the labelled target samples only).',
        )
    return value


def _resolve(base: Path | None, p: str) -> Path:
    q = Path(p).expanduser()
    if not q.is_absolute() and base is not None:
        q = base / q
    return q.resolve()


def _gram_dir(base: Path | None, value: Any) -> Path | None:
    """``[data] gram_dir``: the Gram folder (created when a Gram is first computed)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _err(
            "data", f'gram_dir must be a folder path, e.g. gram_dir = "grams"; got {value!r}.'
        )
    folder = _resolve(base, value)
    if folder.exists() and not folder.is_dir():
        raise _err(
            "data",
            f"gram_dir {str(folder)!r} is a file, not a folder; point it at the folder that "
            "holds the Grams (relative paths are read from the spec file's folder).",
        )
    return folder


def _gram_precision(raw: dict) -> str:
    """``[gram] precision``: the precision of the study's Grams (default exact float64)."""
    gram = _table(raw, "gram")
    _check_keys("gram", gram, {"precision"})
    precision = gram.get("precision", "float64")
    if precision not in GRAM_PRECISIONS:
        raise _err(
            "gram",
            f'precision must be one of {GRAM_PRECISIONS}, got {precision!r}: "float64" is '
            'the exact Gram, "mixed" multiplies float32 features in float32 and sums in '
            "float64 (faster, relative error about 1e-7 on nonnegative features).",
        )
    return precision


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
    if not isinstance(raw, dict):
        raise SpecError("study spec: the file must hold a table/mapping at top level.")
    _check_keys(
        "top level",
        raw,
        {"study", "data", "gram", "splits", "methods", "execution", "tracking", "report"},
    )
    base = path.parent if path is not None else None
    study = _table(raw, "study", required=True)
    _check_keys("study", study, {"name", "seed", "output", "description"})
    name = study.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\:"):
        raise _err(
            "study", f"name must be a non-empty string without '/', '\\' or ':', got {name!r}."
        )
    seed = _int("study", "seed", study.get("seed", 0))
    out = output if output is not None else study.get("output")
    out_path = (
        Path(out).expanduser().resolve()
        if out is not None
        else (Path.cwd() / DEFAULT_OUTPUT_ROOT / name).resolve()
    )

    data = _table(raw, "data", required=True)
    _check_keys(
        "data",
        data,
        {
            "store",
            "builtin",
            "synthetic",
            "preprocessing",
            "source_space",
            "target_space",
            "space",
            "pairs",
            "gram_dir",
        },
    )
    sources = [k for k in ("store", "builtin", "synthetic") if k in data]
    if len(sources) != 1:
        raise _err(
            "data",
            'give exactly one of store = "path", builtin = '
            f'"office_caltech10" or a [data.synthetic] table; got {sources}.',
        )
    store = builtin = synthetic = None
    if "store" in data:
        store = _resolve(base, str(data["store"]))
        if not store.exists():
            raise _err(
                "data",
                f"feature store {str(store)!r} does not exist; create it with "
                "`mmdtl2 ingest` or fix the path (relative paths are read "
                "from the spec file's folder).",
            )
    elif "builtin" in data:
        builtin = data["builtin"]
        if builtin not in BUILTIN_DATA:
            raise _err(
                "data", f"unknown builtin data set {builtin!r}; choose one of {BUILTIN_DATA}."
            )
    else:
        synthetic = data["synthetic"]
        if not isinstance(synthetic, dict):
            raise _err("data", "synthetic must be a table of generator options.")
    prep = data.get("preprocessing", DEFAULT_PREPROCESSING)
    if prep not in PREPROCESSING:
        raise _err("data", f"preprocessing must be one of {PREPROCESSING}, got {prep!r}.")
    gram_dir = _gram_dir(base, data.get("gram_dir"))
    space = data.get("space")
    src_space = data.get("source_space", space)
    tgt_space = data.get("target_space", space if space is not None else src_space)
    if not isinstance(src_space, str) or not isinstance(tgt_space, str):
        raise _err(
            "data",
            'name the feature spaces: space = "..." (shared) or source_space / target_space.',
        )
    pairs = data.get("pairs")
    if pairs == "all":
        pass
    elif (
        not isinstance(pairs, list)
        or not pairs
        or not all(
            isinstance(p, list | tuple)
            and len(p) == 2
            and all(isinstance(d, str) for d in p)
            and p[0] != p[1]
            for p in pairs
        )
    ):
        raise _err(
            "data",
            'pairs must be "all" or a list of [source device, target device] '
            f"pairs of different devices, got {pairs!r}.",
        )
    else:
        pairs = [tuple(p) for p in pairs]
        if len(set(pairs)) != len(pairs):
            raise _err("data", "pairs lists a device pair twice.")

    sp = _table(raw, "splits", required=True)
    _check_keys(
        "splits",
        sp,
        {
            "protocol",
            "n_splits",
            "train_fraction",
            "file",
            "source_per_class",
            "samples_per_class",
            "unlabelled",
        },
    )
    unlabelled = _unlabelled("splits", sp.get("unlabelled", "non-test"))
    protocol = sp.get("protocol", "half")
    if protocol not in PROTOCOLS:
        raise _err("splits", f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")
    split_file = None
    if protocol == "fixed":
        if "file" not in sp and builtin is None:
            raise _err(
                "splits",
                "protocol 'fixed' needs file = \"splits.json\" (see "
                "mmdtl2_dist.study.data.read_split_file).",
            )
        if "file" in sp:
            split_file = _resolve(base, str(sp["file"]))
            if not split_file.exists():
                raise _err("splits", f"split file {str(split_file)!r} does not exist.")
    n_splits = _int("splits", "n_splits", sp.get("n_splits", 10), minimum=1)
    frac = sp.get("train_fraction", 0.5)
    if not _is_num(frac) or not 0 < frac < 1:
        raise _err("splits", f"train_fraction must be a number in (0, 1), got {frac!r}.")
    spc_raw = sp.get("samples_per_class")
    if (
        not isinstance(spc_raw, list)
        or not spc_raw
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in spc_raw)
    ):
        raise _err(
            "splits",
            "samples_per_class must be a non-empty list of integers >= 0, "
            f"e.g. [1, 2, 3, 5, 10]; got {spc_raw!r}.",
        )
    if len(set(spc_raw)) != len(spc_raw):
        raise _err("splits", f"samples_per_class repeats a value: {spc_raw!r}.")
    spc = sorted(spc_raw)
    spc_src = sp.get("source_per_class")
    if spc_src is not None:
        spc_src = _int("splits", "source_per_class", spc_src, minimum=1)

    methods = _methods(raw.get("methods"))
    if not (src_space == tgt_space):
        bad = [m.label for m in methods if m.method in SAME_SPACE_METHODS or m.select == "auto"]
        if bad:
            raise _err(
                "methods",
                f"{bad} need source and target in one feature space but "
                f"the study maps {src_space!r} to {tgt_space!r}; remove "
                "them (the paper drops source SVM and MMDT here too).",
            )
    if 0 in spc:
        bad = [m.label for m in methods if m.method != "source_svm"]
        if bad:
            raise _err(
                "splits",
                f"samples_per_class contains 0 but {bad} need labelled "
                "target samples; remove 0 or those methods.",
            )

    ex = _table(raw, "execution")
    _check_keys("execution", ex, {"cpus_per_trial", "split_tasks", "max_concurrent_trials"})
    cpus = ex.get("cpus_per_trial", 1)
    if not _is_num(cpus) or cpus <= 0:
        raise _err("execution", f"cpus_per_trial must be a positive number, got {cpus!r}.")
    split_tasks = _int("execution", "split_tasks", ex.get("split_tasks", 0))
    max_conc = _int("execution", "max_concurrent_trials", ex.get("max_concurrent_trials", 0))

    tr = _table(raw, "tracking")
    _check_keys("tracking", tr, {"uri", "experiment"})
    rep = _table(raw, "report")
    _check_keys("report", rep, {"reference_source", "reference_target"})
    labels = {c.label for c in expand_configs(methods)}
    for k in ("reference_source", "reference_target"):
        if k in rep and rep[k] not in labels:
            raise _err(
                "report", f"{k} = {rep[k]!r} is not a method label; labels are {sorted(labels)}."
            )
    return StudySpec(
        path=path,
        raw=raw,
        name=name,
        seed=seed,
        output=out_path,
        description=str(study.get("description", "")),
        store=store,
        builtin=builtin,
        synthetic=synthetic,
        preprocessing=prep,
        source_space=src_space,
        target_space=tgt_space,
        pairs=pairs,
        protocol=protocol,
        n_splits=n_splits,
        train_fraction=float(frac),
        split_file=split_file,
        source_per_class=spc_src,
        samples_per_class=spc,
        methods=methods,
        unlabelled=unlabelled,
        cpus_per_trial=float(cpus),
        split_tasks=split_tasks,
        max_concurrent_trials=max_conc,
        gram_dir=gram_dir,
        gram_precision=_gram_precision(raw),
        tracking_uri=tr.get("uri"),
        experiment=tr.get("experiment"),
        reference_source=rep.get("reference_source"),
        reference_target=rep.get("reference_target"),
    )


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
