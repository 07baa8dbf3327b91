"""The study spec's JSON Schema: its parameter part is the parameter table, and every
section refuses an unknown key, a wrong type and an out-of-range value naming the key."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import pytest

from mmdtl2_dist.core.params import PARAMS, method_params
from mmdtl2_dist.study.spec import ALL_METHODS, EXTRA_PARAMS, SpecError, parse_spec
from mmdtl2_dist.study.spec_schema import SCHEMA, param_schema

_BOUNDS = {
    "minimum": ("low", False),
    "exclusiveMinimum": ("low", True),
    "maximum": ("high", False),
    "exclusiveMaximum": ("high", True),
}


def _method_rules() -> dict[str, dict]:
    """The ``then`` part of the schema's rule for each method."""
    rules = SCHEMA["properties"]["methods"]["items"]["allOf"]
    return {r["if"]["properties"]["method"]["const"]: r["then"]["properties"] for r in rules}


def _scalar(schema: dict, none_word: str | None) -> dict:
    if none_word is None:
        return schema
    assert schema["anyOf"][1] == {"const": none_word}
    return schema["anyOf"][0]


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_schema_parameters_are_the_parameter_table(method):
    table = EXTRA_PARAMS.get(method) or method_params(method)
    rule = _method_rules()[method]
    params = rule["params"]
    assert params["additionalProperties"] is False
    assert set(params["properties"]) == set(table)
    for name, p in table.items():
        s = _scalar(params["properties"][name], p.none_word)
        if p.kind == "choice":
            assert s["enum"] == list(p.choices)
        else:
            assert s["type"] == ("integer" if p.kind == "int" else "number")
            assert s["finite"] is True
            bounds = {k: v for k, v in s.items() if k in _BOUNDS}
            want = {}
            for key, (end, is_open) in _BOUNDS.items():
                value = getattr(p, end)
                if math.isfinite(value) and getattr(p, f"{end}_open") == is_open:
                    want[key] = value
            assert bounds == want, name
        # grid-able: a non-empty list of distinct values of the same schema
        for sweep in (rule["grid"], rule["select"]["anyOf"][1]):
            lst = sweep["properties"][name]
            assert lst["items"] == params["properties"][name] == param_schema(p)
            assert lst["minItems"] == 1 and lst["uniqueItems"] is True


def test_every_table_parameter_appears_in_the_schema():
    rules = _method_rules()
    named = {n for r in rules.values() for n in r["params"]["properties"]}
    assert set(PARAMS) <= named


def _raw() -> dict:
    return {
        "study": {"name": "s"},
        "data": {"builtin": "office_caltech10", "space": "surf800", "pairs": "all"},
        "splits": {"protocol": "fixed", "samples_per_class": [1, 3]},
        "methods": [{"method": "mmdtl2", "params": {"kernel": "rbf"}}],
    }


def _set(section: str, key: str, value):
    def change(raw):
        table = raw[section][0] if section == "methods" else raw.setdefault(section, {})
        table[key] = value

    return change


def _param(key: str, value):
    return lambda raw: raw["methods"][0]["params"].update({key: value})


# (section as named in the message, change, the text the message must hold)
CASES = [
    ("study", _set("study", "nam", "x"), r"unknown key\(s\) \['nam'\]; allowed keys are"),
    ("study", _set("study", "seed", "0"), "seed must be an integer >= 0, got '0'"),
    ("study", _set("study", "seed", -1), "seed must be an integer >= 0, got -1"),
    ("data", _set("data", "stor", "x"), r"unknown key\(s\) \['stor'\]"),
    ("data", _set("data", "pairs", [["a"]]), r"pairs must be \"all\" or a list"),
    ("data", _set("data", "preprocessing", "l3"), r"preprocessing must be one of \('none'"),
    ("gram", _set("gram", "gpus", 1), r"unknown key\(s\) \['gpus'\]"),
    ("gram", _set("gram", "precision", 16), r"precision must be one of \('float64', 'mixed'\)"),
    ("splits", _set("splits", "n_split", 2), r"unknown key\(s\) \['n_split'\]"),
    ("splits", _set("splits", "n_splits", 2.0), "n_splits must be an integer >= 1, got 2.0"),
    ("splits", _set("splits", "n_splits", 0), "n_splits must be an integer >= 1, got 0"),
    ("splits", _set("splits", "train_fraction", 1.0), r"train_fraction must be a number in \(0"),
    ("execution", _set("execution", "gpus", 1), r"unknown key\(s\) \['gpus'\]"),
    ("execution", _set("execution", "cpus_per_trial", "2"), "cpus_per_trial must be a positive"),
    ("execution", _set("execution", "cpus_per_trial", math.inf), "cpus_per_trial .* got inf"),
    ("execution", _set("execution", "split_tasks", -1), "split_tasks must be an integer >= 0"),
    ("tracking", _set("tracking", "url", "x"), r"unknown key\(s\) \['url'\]"),
    ("tracking", _set("tracking", "uri", 3), "uri must be an MLflow tracking URI, got 3"),
    ("report", _set("report", "ref", "x"), r"unknown key\(s\) \['ref'\]"),
    ("report", _set("report", "reference_source", 1), "reference_source must be a method label"),
    ("methods #1", _set("methods", "labl", "x"), r"unknown key\(s\) \['labl'\]"),
    ("methods #1", _set("methods", "unlabelled", 1), r"unlabelled must be one of \('non-test'"),
    ("methods #1", _param("c_q", 1.0), "method 'mmdtl2' has no parameter 'c_q'; its param"),
    ("methods #1", _param("kernel", 1), r"kernel must be one of \('linear'"),
    ("methods #1", _param("max_iter", 2.0), "max_iter must be a positive integer, got 2.0"),
    ("methods #1", _param("c_f", math.nan), "c_f must be a positive finite number, got nan"),
    ("methods #1", _param("c_s", 1e7), "c_s must be a positive number of at most 1e"),
    ("methods #1", _param("gamma", "none"), r'gamma must be .* or None \(written "auto"'),
    (
        "methods #1",
        _set("methods", "grid", {"c_d": [0.1, -1.0]}),
        "c_d must be a non-negative finite number, got -1",
    ),
    ("methods #1", _set("methods", "grid", {"c_d": [1, 1]}), r"grid.c_d repeats a value"),
    ("methods #1", _set("methods", "select", {"c_d": 1}), "select.c_d must be a non-empty list"),
    ("top level", lambda raw: raw.update(extra={}), r"unknown key\(s\) \['extra'\]"),
    # a misspelt required table or key: named beside the one that is missing
    (
        "splits",
        lambda raw: raw.update(split=raw.pop("splits")),
        r"missing table; add a \[splits\] section \(and \['split'\] is not a key here",
    ),
    (
        "splits",
        lambda raw: raw["splits"].update(sample_per_class=raw["splits"].pop("samples_per_class")),
        r"missing key samples_per_class; .* \(and \['sample_per_class'\] is not a key here",
    ),
]


@pytest.mark.parametrize(("where", "change", "match"), CASES)
def test_each_section_refuses_unknown_keys_types_and_ranges_naming_the_key(where, change, match):
    raw = _raw()
    change(raw)
    with pytest.raises(SpecError, match=match) as err:
        parse_spec(raw)
    assert str(err.value).startswith(f"study spec: [{where}] ")


def test_every_section_of_the_spec_is_in_the_schema():
    for name, section in SCHEMA["properties"].items():
        if name != "methods":
            assert section["additionalProperties"] is False, name
    assert SCHEMA["properties"]["methods"]["items"]["additionalProperties"] is False


def test_spec_schema_command_prints_the_schema(capsys):
    from mmdtl2_dist.cli import main

    assert main(["study", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(SCHEMA))


def test_schema_accepts_the_bundled_specs():
    import tomllib
    from pathlib import Path

    validator = jsonschema.Draft202012Validator(SCHEMA)
    for p in sorted(Path(__file__).resolve().parents[1].glob("studies/*.toml")):
        raw = copy.deepcopy(tomllib.loads(p.read_text()))
        assert not list(validator.iter_errors(raw)), p.name


@pytest.mark.parametrize(
    "args", [["study", "schema"], ["study", "validate", "studies/office_caltech10.toml"]]
)
def test_output_piped_into_a_reader_that_stops_early_ends_quietly(args):
    """`mmdtl2 study schema | head -1`: the reader closes the pipe; the command stops with
    the shell's status for SIGPIPE (141) and no BrokenPipeError traceback, for output
    larger than the pipe (77 KB) and for a few lines still in Python's buffer at the end
    (the interpreter's own flush at exit would print "Exception ignored" and exit 120)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmdtl2_dist.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env, cwd=root,
    )  # fmt: skip
    proc.stdout.close()  # before the child has written (it imports for a second first)
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == b""


def test_a_command_started_with_stdout_closed_succeeds():
    """`mmdtl2 study schema >&-` (a daemon's closed stdout: Python's sys.stdout is None):
    the output has nowhere to go, and the command still succeeds."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = f"'{sys.executable}' -m mmdtl2_dist.cli study schema >&-"
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
