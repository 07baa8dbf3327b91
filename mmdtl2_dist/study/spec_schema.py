"""The JSON Schema of a study spec, and its refusals as messages that name the key and the fix.

:data:`SCHEMA` (Draft 2020-12) holds every shape rule of a spec: the sections and their
keys, each key's type, range and accepted values. The method parameters' part is derived
from the parameter table (:data:`mmdtl2_dist.core.params.PARAMS` through
:func:`~mmdtl2_dist.core.params.method_params`, and the baselines'
:data:`~mmdtl2_dist.study.spec.EXTRA_PARAMS`): each parameter is a scalar in ``params`` and
a non-empty list of such scalars in ``grid`` and ``select``. What a schema cannot say
(paths against the file system, pairs against the store, ``select = "auto"``'s rules, the
methods against the data) stays in :mod:`mmdtl2_dist.study.spec_sections`.

:func:`check_schema` validates a parsed spec and turns the most relevant refusal
(:func:`jsonschema.exceptions.best_match`) into ``study spec: [section] key must be ...,
got ...``; a parameter's refusal is the table's own message
(:meth:`~mmdtl2_dist.core.params.Param.refusal`), the one the core and the estimators give.
``mmdtl2 study schema`` prints :data:`SCHEMA` for editors.
"""

from __future__ import annotations

import math
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

from mmdtl2_dist.core.params import Param, method_params
from mmdtl2_dist.core.preprocessing import PREPROCESSING
from mmdtl2_dist.engine.products import PRECISIONS as GRAM_PRECISIONS
from mmdtl2_dist.study.pools import NAMED_POOL_MODES
from mmdtl2_dist.study.spec import (
    ALL_METHODS,
    BUILTIN_DATA,
    EXTRA_PARAMS,
    UNLABELLED_POOLS,
    SpecError,
)
from mmdtl2_dist.study.splits import PROTOCOLS

#: Sections a spec must have.
REQUIRED_SECTIONS = ("study", "data", "splits", "methods")


def param_schema(p: Param) -> dict:
    """The JSON Schema of one parameter value (``finite`` refuses NaN and infinities)."""
    if p.kind == "choice":
        s: dict = {"enum": list(p.choices)}
    else:
        s = {"type": "integer" if p.kind == "int" else "number", "finite": True}
        if p.low > -math.inf:
            s["exclusiveMinimum" if p.low_open else "minimum"] = p.low
        if p.high < math.inf:
            s["exclusiveMaximum" if p.high_open else "maximum"] = p.high
    s["description"] = p.doc
    if p.none_word is not None:
        s = {"anyOf": [s, {"const": p.none_word}], "description": p.doc}
    return s


def method_param_table(method: str) -> dict[str, Param]:
    """The :class:`Param` of every parameter a spec may give ``method``."""
    return EXTRA_PARAMS[method] if method in EXTRA_PARAMS else method_params(method)


def _sweep(props: dict) -> dict:
    """``grid`` / ``select``: each parameter as a non-empty list of distinct values."""
    lists = {
        k: {"type": "array", "minItems": 1, "uniqueItems": True, "items": s}
        for k, s in props.items()
    }
    return {"type": "object", "properties": lists, "additionalProperties": False}


def _method_rule(method: str) -> dict:
    """The ``params``, ``grid`` and ``select`` of the entries whose method is ``method``.

    Which methods ``select`` (``"auto"`` or a table) is offered for is a rule of
    :func:`~mmdtl2_dist.study.spec_sections.methods_section`, whose message says so.
    """
    props = {k: param_schema(p) for k, p in method_param_table(method).items()}
    table = {"type": "object", "properties": props, "additionalProperties": False}
    sweep = _sweep(props)
    select = {"anyOf": [{"const": "auto"}, sweep]}
    return {
        "if": {"properties": {"method": {"const": method}}, "required": ["method"]},
        "then": {"properties": {"params": table, "grid": sweep, "select": select}},
    }


def _enum(values, doc: str = "") -> dict:
    return {"enum": list(values), "description": doc or f"one of {tuple(values)}"}


def _int(minimum: int, doc: str = "") -> dict:
    return {"type": "integer", "minimum": minimum, "description": doc or f"an integer >= {minimum}"}


def _string(doc: str) -> dict:
    return {"type": "string", "minLength": 1, "description": doc}


def _section(props: dict, required: tuple = ()) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


_UNLABELLED = {
    "anyOf": [
        {"enum": list(UNLABELLED_POOLS)},
        {
            "type": "object",
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": True,
                    "items": {"type": "string", "minLength": 1},
                },
                "mode": {"enum": list(NAMED_POOL_MODES)},
            },
            "required": ["groups"],
            "additionalProperties": False,
        },
    ],
    "description": f'one of {UNLABELLED_POOLS}: "non-test" (every target sample of the '
    'device outside the test set, unlabelled ones included), "all" (also the test samples\' '
    'features, never their labels: the transductive protocol) or "none" (the labelled target '
    'samples only); or a named pool, a table { groups = ["session_7"], mode = '
    f'{" | ".join(map(repr, NAMED_POOL_MODES))} }} (default mode "non-test"): the samples '
    "of that mode in the named groups of the store's group column, with the labelled ones",
}
_PAIR = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "minItems": 2,
    "maxItems": 2,
}
_PAIRS = {
    "anyOf": [
        {"const": "all"},
        {"type": "array", "minItems": 1, "uniqueItems": True, "items": _PAIR},
    ],
    "description": '"all" or a list of distinct [source device, target device] pairs of '
    'different devices, e.g. pairs = [["lucera", "elite"]]',
}
_METHOD = {
    "type": "object",
    "properties": {
        "label": _string("a non-empty string (default: the method)"),
        "method": _enum(ALL_METHODS),
        "params": {"type": "object", "description": "a table of parameter = value"},
        "grid": {"type": "object", "description": "a table of parameter = [values]"},
        "select": {
            "anyOf": [{"const": "auto"}, {"type": "object"}],
            "description": '"auto" or a table of parameter = [values]',
        },
        "unlabelled": _UNLABELLED,
    },
    "required": ["method"],
    "additionalProperties": False,
    "allOf": [_method_rule(m) for m in ALL_METHODS],
}

#: The JSON Schema (Draft 2020-12) of a study spec.
SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mmdtl2-dist study spec",
    "type": "object",
    "required": list(REQUIRED_SECTIONS),
    "additionalProperties": False,
    "properties": {
        "study": _section(
            {
                "name": {
                    "type": "string",
                    "pattern": r"^[^/\\:]+$",
                    "description": "a non-empty string without '/', '\\' or ':'",
                },
                "seed": _int(0),
                "output": _string("a folder path"),
                "description": {"type": "string", "description": "a string"},
            },
            required=("name",),
        ),
        "data": _section(
            {
                "store": _string('a feature store path, e.g. store = "features.zarr"'),
                "builtin": _enum(BUILTIN_DATA),
                "synthetic": {"type": "object", "description": "a table of generator options"},
                "preprocessing": _enum(PREPROCESSING),
                "space": _string("a feature space name"),
                "source_space": _string("a feature space name"),
                "target_space": _string("a feature space name"),
                "pairs": _PAIRS,
                "gram_dir": _string('a folder path, e.g. gram_dir = "grams"'),
            },
            required=("pairs",),
        ),
        "gram": _section(
            {
                "precision": _enum(
                    GRAM_PRECISIONS,
                    f'one of {GRAM_PRECISIONS}: "float64" is the exact Gram, "mixed" '
                    "multiplies float32 features in float32 and sums in float64 (faster, "
                    "relative error about 1e-7 on nonnegative features)",
                )
            }
        ),
        "splits": _section(
            {
                "protocol": _enum(PROTOCOLS),
                "n_splits": _int(1),
                "train_fraction": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 1,
                    "description": "a number in (0, 1)",
                },
                "file": _string('a split file path, e.g. file = "splits.json"'),
                "source_per_class": _int(1),
                "samples_per_class": {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": True,
                    "items": {"type": "integer", "minimum": 0},
                    "description": "a non-empty list of distinct integers >= 0, e.g. "
                    "[1, 2, 3, 5, 10]",
                },
                "unlabelled": _UNLABELLED,
            },
            required=("samples_per_class",),
        ),
        "methods": {
            "type": "array",
            "minItems": 1,
            "items": _METHOD,
            "description": 'at least one [[methods]] entry (e.g. [[methods]] method = "mmdtl2")',
        },
        "execution": _section(
            {
                "cpus_per_trial": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "finite": True,
                    "description": "a positive number",
                },
                "split_tasks": _int(0),
                "max_concurrent_trials": _int(0),
            }
        ),
        "tracking": _section(
            {
                "uri": _string("an MLflow tracking URI"),
                "experiment": _string("an MLflow experiment name"),
            }
        ),
        "report": _section(
            {
                "reference_source": _string("a method label"),
                "reference_target": _string("a method label"),
            }
        ),
    },
}


def _finite(validator, finite, instance, schema):
    """The ``finite`` keyword: a number must not be NaN or infinite (TOML has both)."""
    if finite and isinstance(instance, float) and not math.isfinite(instance):
        yield ValidationError(f"{instance!r} is not a finite number")


def _is_integer(checker, instance) -> bool:
    """An integer is an ``int`` (not ``1.0``, not ``True``), as the parameter table says."""
    return isinstance(instance, int) and not isinstance(instance, bool)


SpecValidator = validators.extend(
    Draft202012Validator,
    {"finite": _finite},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)
_VALIDATOR = SpecValidator(SCHEMA)


def check_schema(raw: Any) -> None:
    """Raise :class:`SpecError` naming the key and the fix unless ``raw`` fits :data:`SCHEMA`."""
    error = best_match(_VALIDATOR.iter_errors(raw))
    if error is not None:
        where, message = explain(raw, error)
        raise SpecError(f"study spec: [{where}] {message}")


def explain(raw: Any, error: ValidationError) -> tuple[str, str]:
    """The section and the message of a schema refusal."""
    path = list(error.absolute_path)
    if not path:
        return _top_level(raw, error)
    if path[0] == "methods" and len(path) >= 2:
        return f"methods #{path[1] + 1}", _method_message(raw["methods"][path[1]], path[2:], error)
    section = path[0]
    if len(path) == 1:
        return section, _table_message(section, SCHEMA["properties"][section], error)
    key = path[1]
    prop = SCHEMA["properties"][section]["properties"][key]
    return section, _value_message(key, raw[section][key], prop)


def _top_level(raw: Any, error: ValidationError) -> tuple[str, str]:
    if not isinstance(raw, dict):
        return "top level", "the file must hold a table/mapping at top level."
    if error.validator == "required":
        missing = next(s for s in REQUIRED_SECTIONS if s not in raw)
        typo = _misspelt(raw, SCHEMA)
        if missing == "methods":
            add = SCHEMA["properties"]["methods"]["description"]
            return "methods", f"missing; add {add}{typo}."
        return missing, f"missing table; add a [{missing}] section{typo}."
    return "top level", _unknown_keys(raw, SCHEMA)


def _misspelt(table: dict, schema: dict) -> str:
    """``" (and [x] is not a key here: misspelt?)"`` for the unknown keys of ``table``."""
    unknown = sorted(set(table) - set(schema.get("properties", {})))
    return f" (and {unknown} is not a key here: misspelt?)" if unknown else ""


def _unknown_keys(table: dict, schema: dict) -> str:
    allowed = sorted(schema["properties"])
    unknown = sorted(set(table) - set(allowed))
    return f"unknown key(s) {unknown}; allowed keys are {allowed}."


def _table_message(section: str, schema: dict, error: ValidationError) -> str:
    """A refusal of a whole section (its type, a missing or an unknown key)."""
    if error.validator == "additionalProperties":
        return _unknown_keys(error.instance, schema)
    if error.validator == "required":
        key = next(k for k in schema["required"] if k not in error.instance)
        add = schema["properties"][key]["description"]
        return f"missing key {key}; add {key} = {add}{_misspelt(error.instance, schema)}."
    if "description" in schema:
        return f"must be {schema['description']}, got {error.instance!r}."
    return f"must be a table, got {type(error.instance).__name__}."


def _value_message(key: str, value: Any, schema: dict) -> str:
    return f"{key} must be {schema['description']}, got {value!r}."


def _method_message(entry: Any, path: list, error: ValidationError) -> str:
    """A refusal inside one ``[[methods]]`` entry; parameters get the table's message."""
    if not path:
        if not isinstance(entry, dict):
            return "each method must be a table."
        return _table_message("methods", _METHOD, error)
    key, rest = path[0], path[1:]
    if key not in ("params", "grid", "select") or entry.get("method") not in ALL_METHODS:
        return _value_message(key, entry[key], _METHOD["properties"][key])
    method, value = entry["method"], entry[key]
    table = method_param_table(method)
    if not isinstance(value, dict):
        return _value_message(key, value, _METHOD["properties"][key])
    if not rest:
        bad = ", ".join(map(repr, sorted(set(value) - set(table))))
        return f"method {method!r} has no parameter {bad}; its parameters are {sorted(table)}."
    name = rest[0]
    if key == "params":
        return table[name].refusal(name, value[name])
    if len(rest) == 2:
        return table[name].refusal(name, value[name][rest[1]])
    values = value[name]
    if isinstance(values, list) and values:
        return f"{key}.{name} repeats a value: {values!r}."
    return (
        f"{key}.{name} must be a non-empty list of values, got {values!r}; "
        f"write {name} = [value1, value2]."
    )
