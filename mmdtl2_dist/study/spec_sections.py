"""How each section of a study spec is validated (:func:`mmdtl2_dist.study.spec.parse_spec`).

One function per section; each returns the :class:`~mmdtl2_dist.study.spec.StudySpec`
fields it sets, and every refusal is a :class:`~mmdtl2_dist.study.spec.SpecError` that
names the section, the key and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mmdtl2_dist.core.preprocessing import DEFAULT_PREPROCESSING, PREPROCESSING
from mmdtl2_dist.engine.products import PRECISIONS as GRAM_PRECISIONS
from mmdtl2_dist.study.spec import (
    ALL_METHODS,
    BUILTIN_DATA,
    CORE_METHODS,
    DEFAULT_OUTPUT_ROOT,
    EXTRA_METHODS,
    SAME_SPACE_METHODS,
    UNLABELLED_POOLS,
    MethodSpec,
    _err,
    check_param,
)
from mmdtl2_dist.study.splits import PROTOCOLS


def table(raw: dict, name: str, required: bool = False) -> dict:
    t = raw.get(name)
    if t is None:
        if required:
            raise _err(name, f"missing table; add a [{name}] section.")
        return {}
    if not isinstance(t, dict):
        raise _err(name, f"must be a table, got {type(t).__name__}.")
    return t


def check_keys(where: str, table: dict, allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _err(where, f"unknown key(s) {unknown}; allowed keys are {sorted(allowed)}.")


def integer(where: str, key: str, v: Any, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(where, f"{key} must be an integer >= {minimum}, got {v!r}.")
    return v


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


def methods_section(raw: Any) -> list[MethodSpec]:
    """``[[methods]]``: each entry's method, label, params, grid, select and pool."""
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
        check_keys(where, m, {"label", "method", "params", "grid", "select", "unlabelled"})
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


def gram_precision(raw: dict) -> str:
    """``[gram] precision``: the precision of the study's Grams (default exact float64)."""
    gram = table(raw, "gram")
    check_keys("gram", gram, {"precision"})
    precision = gram.get("precision", "float64")
    if precision not in GRAM_PRECISIONS:
        raise _err(
            "gram",
            f'precision must be one of {GRAM_PRECISIONS}, got {precision!r}: "float64" is '
            'the exact Gram, "mixed" multiplies float32 features in float32 and sums in '
            "float64 (faster, relative error about 1e-7 on nonnegative features).",
        )
    return precision


def study_section(raw: dict, output: str | Path | None) -> dict:
    """``[study]``: name, seed, output folder (``output`` overrides it), description."""
    study = table(raw, "study", required=True)
    check_keys("study", study, {"name", "seed", "output", "description"})
    name = study.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\:"):
        raise _err(
            "study", f"name must be a non-empty string without '/', '\\' or ':', got {name!r}."
        )
    out = output if output is not None else study.get("output")
    out_path = (
        Path(out).expanduser().resolve()
        if out is not None
        else (Path.cwd() / DEFAULT_OUTPUT_ROOT / name).resolve()
    )
    return {
        "name": name,
        "seed": integer("study", "seed", study.get("seed", 0)),
        "output": out_path,
        "description": str(study.get("description", "")),
    }


_DATA_KEYS = {"store", "builtin", "synthetic", "preprocessing", "source_space",
              "target_space", "space", "pairs", "gram_dir"}  # fmt: skip


def data_section(raw: dict, base: Path | None) -> dict:
    """``[data]``: where the features come from, the spaces, the pairs, the Gram folder."""
    data = table(raw, "data", required=True)
    check_keys("data", data, _DATA_KEYS)
    prep = data.get("preprocessing", DEFAULT_PREPROCESSING)
    if prep not in PREPROCESSING:
        raise _err("data", f"preprocessing must be one of {PREPROCESSING}, got {prep!r}.")
    space = data.get("space")
    src_space = data.get("source_space", space)
    tgt_space = data.get("target_space", space if space is not None else src_space)
    if not isinstance(src_space, str) or not isinstance(tgt_space, str):
        raise _err(
            "data",
            'name the feature spaces: space = "..." (shared) or source_space / target_space.',
        )
    return {
        **_data_source(data, base),
        "preprocessing": prep,
        "gram_dir": _gram_dir(base, data.get("gram_dir")),
        "source_space": src_space,
        "target_space": tgt_space,
        "pairs": _pairs(data.get("pairs")),
    }


def _data_source(data: dict, base: Path | None) -> dict:
    """Exactly one of ``store``, ``builtin`` and ``[data.synthetic]``."""
    sources = [k for k in ("store", "builtin", "synthetic") if k in data]
    if len(sources) != 1:
        raise _err(
            "data",
            'give exactly one of store = "path", builtin = '
            f'"office_caltech10" or a [data.synthetic] table; got {sources}.',
        )
    out = {"store": None, "builtin": None, "synthetic": None}
    if "store" in data:
        out["store"] = store = _resolve(base, str(data["store"]))
        if not store.exists():
            raise _err(
                "data",
                f"feature store {str(store)!r} does not exist; create it with "
                "`mmdtl2 ingest` or fix the path (relative paths are read "
                "from the spec file's folder).",
            )
    elif "builtin" in data:
        out["builtin"] = builtin = data["builtin"]
        if builtin not in BUILTIN_DATA:
            raise _err(
                "data", f"unknown builtin data set {builtin!r}; choose one of {BUILTIN_DATA}."
            )
    else:
        out["synthetic"] = data["synthetic"]
        if not isinstance(out["synthetic"], dict):
            raise _err("data", "synthetic must be a table of generator options.")
    return out


def _pairs(pairs: Any) -> list[tuple[str, str]] | str:
    """``pairs``: ``"all"`` or distinct [source device, target device] pairs."""
    if pairs == "all":
        return pairs
    if (
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
    pairs = [tuple(p) for p in pairs]
    if len(set(pairs)) != len(pairs):
        raise _err("data", "pairs lists a device pair twice.")
    return pairs


_SPLIT_KEYS = {"protocol", "n_splits", "train_fraction", "file", "source_per_class",
               "samples_per_class", "unlabelled"}  # fmt: skip


def splits_section(raw: dict, base: Path | None, builtin: str | None) -> dict:
    """``[splits]``: protocol, split file, fractions, labelled samples per class, pool."""
    sp = table(raw, "splits", required=True)
    check_keys("splits", sp, _SPLIT_KEYS)
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
    frac = sp.get("train_fraction", 0.5)
    if not _is_num(frac) or not 0 < frac < 1:
        raise _err("splits", f"train_fraction must be a number in (0, 1), got {frac!r}.")
    spc_src = sp.get("source_per_class")
    if spc_src is not None:
        spc_src = integer("splits", "source_per_class", spc_src, minimum=1)
    return {
        "unlabelled": unlabelled,
        "protocol": protocol,
        "split_file": split_file,
        "n_splits": integer("splits", "n_splits", sp.get("n_splits", 10), minimum=1),
        "train_fraction": float(frac),
        "source_per_class": spc_src,
        "samples_per_class": _samples_per_class(sp.get("samples_per_class")),
    }


def _samples_per_class(spc_raw: Any) -> list[int]:
    """``samples_per_class``: distinct integers >= 0, sorted."""
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
    return sorted(spc_raw)


def check_methods_fit_data(fields: dict) -> None:
    """The methods against the data: one feature space where needed, labelled targets."""
    methods, src_space, tgt_space = (
        fields["methods"],
        fields["source_space"],
        fields["target_space"],
    )
    if src_space != tgt_space:
        bad = [m.label for m in methods if m.method in SAME_SPACE_METHODS or m.select == "auto"]
        if bad:
            raise _err(
                "methods",
                f"{bad} need source and target in one feature space but "
                f"the study maps {src_space!r} to {tgt_space!r}; remove "
                "them (the paper drops source SVM and MMDT here too).",
            )
    if 0 in fields["samples_per_class"]:
        bad = [m.label for m in methods if m.method != "source_svm"]
        if bad:
            raise _err(
                "splits",
                f"samples_per_class contains 0 but {bad} need labelled "
                "target samples; remove 0 or those methods.",
            )


def execution_section(raw: dict) -> dict:
    """``[execution]``: CPUs per trial, split tasks, concurrent trials."""
    ex = table(raw, "execution")
    check_keys("execution", ex, {"cpus_per_trial", "split_tasks", "max_concurrent_trials"})
    cpus = ex.get("cpus_per_trial", 1)
    if not _is_num(cpus) or cpus <= 0:
        raise _err("execution", f"cpus_per_trial must be a positive number, got {cpus!r}.")
    return {
        "cpus_per_trial": float(cpus),
        "split_tasks": integer("execution", "split_tasks", ex.get("split_tasks", 0)),
        "max_concurrent_trials": integer(
            "execution", "max_concurrent_trials", ex.get("max_concurrent_trials", 0)
        ),
    }


def tracking_section(raw: dict) -> dict:
    """``[tracking]``: the MLflow tracking URI and experiment."""
    tr = table(raw, "tracking")
    check_keys("tracking", tr, {"uri", "experiment"})
    return {"tracking_uri": tr.get("uri"), "experiment": tr.get("experiment")}


def report_section(raw: dict, labels: set[str]) -> dict:
    """``[report]``: the reference columns, each one of the method ``labels``."""
    rep = table(raw, "report")
    check_keys("report", rep, {"reference_source", "reference_target"})
    for k in ("reference_source", "reference_target"):
        if k in rep and rep[k] not in labels:
            raise _err(
                "report", f"{k} = {rep[k]!r} is not a method label; labels are {sorted(labels)}."
            )
    return {k: rep.get(k) for k in ("reference_source", "reference_target")}
