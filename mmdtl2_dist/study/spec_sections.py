"""The rules of a study spec that its JSON Schema cannot state (:func:`~.spec.parse_spec`).

:func:`mmdtl2_dist.study.spec_schema.check_schema` has checked every section's keys, types,
ranges and accepted values (the method parameters' from the parameter table) first. One
function per section turns the checked section into the
:class:`~mmdtl2_dist.study.spec.StudySpec` fields it sets, and checks what depends on other
keys, other entries or the file system: paths relative to the spec, one data source,
distinct labels, ``select = "auto"``'s rules, the methods against the data. Every refusal
is a :class:`~mmdtl2_dist.study.spec.SpecError` that names the section, the key and the fix.
"""

from __future__ import annotations

from pathlib import Path

from mmdtl2_dist.core.preprocessing import DEFAULT_PREPROCESSING
from mmdtl2_dist.study.pools import DEFAULT_POOL, canonical_pool
from mmdtl2_dist.study.spec import (
    CORE_METHODS,
    DEFAULT_OUTPUT_ROOT,
    EXTRA_METHODS,
    PRIOR_MATRIX,
    SAME_SPACE_METHODS,
    MethodSpec,
    _err,
)


def _grid(g: dict | None) -> dict[str, list]:
    return {k: list(vals) for k, vals in (g or {}).items()}


def methods_section(raw: list) -> list[MethodSpec]:
    """``[[methods]]``: each entry's method, label, params, grid, select and pool.

    The shapes and the parameter values are the schema's (:mod:`.spec_schema`); here are
    the rules across keys and entries.
    """
    out, labels = [], set()
    for i, m in enumerate(raw):
        where, method = f"methods #{i + 1}", m["method"]
        label = str(m.get("label", method))
        if label in labels:
            raise _err(
                where, f"label {label!r} is used twice; give each method entry a distinct label."
            )
        labels.add(label)
        params, grid = dict(m.get("params") or {}), _grid(m.get("grid"))
        _check_prior(where, {**params, **grid})
        if m.get("select") == "auto":
            _check_auto(where, method, {**params, **grid})
            select = "auto"
        else:
            select = _grid(m.get("select"))
            _check_prior(where, select)
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
        pool = canonical_pool(m["unlabelled"]) if "unlabelled" in m else None
        out.append(MethodSpec(label, method, params, grid, select, pool))
    return out


def _check_prior(where: str, params: dict) -> None:
    """``prior = "matrix"`` needs a W0, which a spec cannot give."""
    values = params.get("prior", [])
    if "matrix" in (values if isinstance(values, list) else [values]):
        raise _err(where, PRIOR_MATRIX)


def _check_auto(where: str, method: str, params: dict) -> None:
    """``select = "auto"``: MMDTL2 only, and the rule's own parameters left to it."""
    from mmdtl2_dist.core.auto import check_auto_request

    try:
        check_auto_request(method, params, 'select = "auto"', "params and grid")
    except ValueError as e:
        raise _err(where, str(e)) from None


def _resolve(base: Path | None, p: str) -> Path:
    q = Path(p).expanduser()
    if not q.is_absolute() and base is not None:
        q = base / q
    return q.resolve()


def _gram_dir(base: Path | None, value: str | None) -> Path | None:
    """``[data] gram_dir``: the Gram folder (created when a Gram is first computed)."""
    if value is None:
        return None
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
    return raw.get("gram", {}).get("precision", "float64")


def study_section(raw: dict, output: str | Path | None) -> dict:
    """``[study]``: name, seed, output folder (``output`` overrides it), description."""
    study = raw["study"]
    name = study["name"]
    out = output if output is not None else study.get("output")
    out_path = (
        Path(out).expanduser().resolve()
        if out is not None
        else (Path.cwd() / DEFAULT_OUTPUT_ROOT / name).resolve()
    )
    return {
        "name": name,
        "seed": study.get("seed", 0),
        "output": out_path,
        "description": study.get("description", ""),
    }


def data_section(raw: dict, base: Path | None) -> dict:
    """``[data]``: where the features come from, the spaces, the pairs, the Gram folder."""
    data = raw["data"]
    space = data.get("space")
    src_space = data.get("source_space", space)
    tgt_space = data.get("target_space", space if space is not None else src_space)
    if src_space is None or tgt_space is None:
        raise _err(
            "data",
            'name the feature spaces: space = "..." (shared) or source_space / target_space.',
        )
    return {
        **_data_source(data, base),
        "preprocessing": data.get("preprocessing", DEFAULT_PREPROCESSING),
        "gram_dir": _gram_dir(base, data.get("gram_dir")),
        "source_space": src_space,
        "target_space": tgt_space,
        "pairs": _pairs(data["pairs"]),
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
    out = {"store": None, "builtin": data.get("builtin"), "synthetic": data.get("synthetic")}
    if "store" in data:
        out["store"] = store = _resolve(base, data["store"])
        if not store.exists():
            raise _err(
                "data",
                f"feature store {str(store)!r} does not exist; create it with "
                "`mmdtl2 ingest` or fix the path (relative paths are read "
                "from the spec file's folder).",
            )
    return out


def _pairs(pairs: list | str) -> list[tuple[str, str]] | str:
    """``pairs``: ``"all"`` or [source device, target device] pairs of different devices."""
    if pairs == "all":
        return pairs
    same = [p for p in pairs if p[0] == p[1]]
    if same:
        raise _err(
            "data",
            f"pairs must be pairs of different devices, got {same!r}; a device pair is "
            "[source device, target device].",
        )
    return [tuple(p) for p in pairs]


def splits_section(raw: dict, base: Path | None, builtin: str | None) -> dict:
    """``[splits]``: protocol, split file, fractions, labelled samples per class, pool."""
    sp = raw["splits"]
    protocol = sp.get("protocol", "half")
    split_file = None
    if protocol == "fixed":
        if "file" not in sp and builtin is None:
            raise _err(
                "splits",
                "protocol 'fixed' needs file = \"splits.json\" (see "
                "mmdtl2_dist.study.data.read_split_file).",
            )
        if "file" in sp:
            split_file = _resolve(base, sp["file"])
            if not split_file.exists():
                raise _err("splits", f"split file {str(split_file)!r} does not exist.")
    return {
        "unlabelled": canonical_pool(sp.get("unlabelled", DEFAULT_POOL)),
        "protocol": protocol,
        "split_file": split_file,
        "n_splits": sp.get("n_splits", 10),
        "train_fraction": float(sp.get("train_fraction", 0.5)),
        "source_per_class": sp.get("source_per_class"),
        "samples_per_class": sorted(sp["samples_per_class"]),
    }


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
    ex = raw.get("execution", {})
    return {
        "cpus_per_trial": float(ex.get("cpus_per_trial", 1)),
        "split_tasks": ex.get("split_tasks", 0),
        "max_concurrent_trials": ex.get("max_concurrent_trials", 0),
    }


def tracking_section(raw: dict) -> dict:
    """``[tracking]``: the MLflow tracking URI and experiment."""
    tr = raw.get("tracking", {})
    return {"tracking_uri": tr.get("uri"), "experiment": tr.get("experiment")}


def report_section(raw: dict, labels: set[str]) -> dict:
    """``[report]``: the reference columns, each one of the method ``labels``."""
    rep = raw.get("report", {})
    for k in ("reference_source", "reference_target"):
        if k in rep and rep[k] not in labels:
            raise _err(
                "report", f"{k} = {rep[k]!r} is not a method label; labels are {sorted(labels)}."
            )
    return {k: rep.get(k) for k in ("reference_source", "reference_target")}
