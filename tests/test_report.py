"""Report: Welch t-test marks against scipy, tables and plots on disk."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mmdtl2_dist.study.report import (
    paper_table,
    results_frame,
    significance_marks,
    welch_pvalue,
    write_report,
)


def test_welch_pvalue_matches_scipy_one_tailed():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(0.9, 0.02, size=10)
        b = rng.normal(0.88, 0.05, size=10)
        ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
        assert welch_pvalue(a, b) == pytest.approx(ref, rel=1e-12)


def test_marks_on_known_inputs():
    # Welch's t for these inputs, computed by hand:
    # a: mean 0.95, var 1e-4 (ddof=1) ; b: mean 0.90, same var ; n = 5 each
    # t = 0.05 / sqrt(2e-5) = 11.18, df = 8 -> p ~ 1.8e-6 -> "**".
    a = np.array([0.94, 0.95, 0.96, 0.95, 0.95]) + np.array([0, 0, 0, -0.01, 0.01]) * 0.5
    b = a - 0.05
    p = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert p < 0.01
    assert significance_marks(a, b, None) == "**"
    assert significance_marks(a, None, b) == "++"
    assert significance_marks(a, b, b) == "** ++"
    # Worse than the reference: no mark (the test is one-tailed).
    assert significance_marks(b, a, a) == ""
    # Between 1 % and 5 %: a single mark. Find such a pair and check against scipy.
    rng = np.random.default_rng(5)
    for _ in range(500):
        x, y = rng.normal(0.5, 0.1, 10), rng.normal(0.45, 0.1, 10)
        p = stats.ttest_ind(x, y, equal_var=False, alternative="greater").pvalue
        expect = "*" if 0.01 <= p < 0.05 else ("**" if p < 0.01 else "")
        assert significance_marks(x, y, None) == expect
    # Both constant: undefined, no mark.
    assert np.isnan(welch_pvalue(np.ones(5), np.ones(5)))
    assert significance_marks(np.ones(5), np.ones(5), None) == ""


def _trials(n_splits=6, pairs=("a->b",)):
    rng = np.random.default_rng(0)
    out = []
    means = {"sourceSVM": 0.80, "targetSVM": 0.70, "MMDTL2": 0.86}
    methods = {"sourceSVM": "source_svm", "targetSVM": "target_svm", "MMDTL2": "mmdtl2"}
    for label, mu in means.items():
        for n in (1, 5):
            units = [
                {"pair": p, "split": s, "accuracy": float(mu + 0.01 * n + rng.normal(0, 0.01))}
                for p in pairs
                for s in range(n_splits)
            ]
            out.append(
                {
                    "key": f"{label}{n}",
                    "label": label,
                    "base_label": label,
                    "method": methods[label],
                    "swept": {},
                    "n_per_class": n,
                    "units": units,
                }
            )
    for cf in (1e-6, 0.1, 10.0):
        units = [
            {"pair": p, "split": s, "accuracy": 0.8 + 0.01 * np.log10(cf), "chosen": {}}
            for p in pairs
            for s in range(n_splits)
        ]
        out.append(
            {
                "key": f"sw{cf}",
                "label": f"MMDTL2 [c_f={cf:g}]",
                "base_label": "MMDTL2",
                "method": "mmdtl2",
                "swept": {"c_f": cf},
                "n_per_class": 5,
                "units": units,
            }
        )
    return out


def test_paper_table_cells_and_marks_match_scipy():
    df = results_frame(_trials())
    t = paper_table(df, "a->b", ["sourceSVM", "targetSVM", "MMDTL2"], "sourceSVM", "targetSVM")
    row = t[(t["n_per_class"] == 5) & (t["label"] == "MMDTL2")].iloc[0]
    a = df[(df.label == "MMDTL2") & (df.n_per_class == 5)].sort_values("split").accuracy
    s = df[(df.label == "sourceSVM") & (df.n_per_class == 5)].sort_values("split").accuracy
    assert row["mean"] == pytest.approx(100 * a.mean())
    assert row["std"] == pytest.approx(100 * a.std(ddof=1))
    assert row["p_source"] == pytest.approx(
        stats.ttest_ind(a, s, equal_var=False, alternative="greater").pvalue
    )
    assert row["marks"] == "** ++"
    src = t[(t["n_per_class"] == 5) & (t["label"] == "sourceSVM")].iloc[0]
    assert src["marks"] == "++" and np.isnan(src["p_source"])


def test_write_report_files(tmp_path):
    out = write_report(
        _trials(pairs=("a->b", "c->d")), tmp_path, title="demo", timing={"study_wall_s": 1.5}
    )
    names = {p.name for p in out["files"]}
    assert {
        "report.md",
        "results.csv",
        "table.csv",
        "accuracy_vs_n_a_b.png",
        "accuracy_vs_n_all_pairs.png",
        "sweep_mmdtl2_c_f.png",
    } <= names
    for p in out["files"]:
        assert p.stat().st_size > 0
    md = (tmp_path / "report.md").read_text()
    assert "| n_per_class | sourceSVM | targetSVM | MMDTL2 |" in md
    assert "Parameter sweep: MMDTL2" in md and "Per pair, 5 labelled" in md
    table = pd.read_csv(tmp_path / "table.csv")
    assert set(table["pair"]) == {"a->b", "c->d", "all pairs"}
    with open(tmp_path / "accuracy_vs_n_a_b.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


# -- one formatter, one spread, one set of names (study report and `mmdtl2 office`) -------


def test_every_table_states_its_spread(tmp_path):
    out = write_report(_trials(pairs=("a->b", "c->d")), tmp_path, title="demo")
    cap = "Accuracy (%): mean ± standard deviation over 6 splits (ddof=1)."
    sections = out["markdown"].split("\n## ")[1:]
    tables = [s for s in sections if "\n| " in s]
    assert tables and all(cap in s for s in tables)
    assert cap in out["summary"]


def _configs(method, params, grid):
    """Every full parameter set a column fits (one, or one per grid point)."""
    from mmdtl2_dist.core.methods import default_params

    full = [{**default_params(method), **params, **g} for g in grid or [{}]]
    return method, frozenset(json.dumps(p, sort_keys=True) for p in full)


def test_bundled_office_studies_name_their_columns_as_mmdtl2_office_does():
    from mmdtl2_dist.core.methods import METHODS
    from mmdtl2_dist.office import COLUMNS
    from mmdtl2_dist.study.spec import core_params, load_spec

    office = {}
    for c in COLUMNS:
        select = c.get("select", {})
        if select == "auto":  # the rule's column: named alike in the bundled study
            office["auto"] = c["label"]
            continue
        grid = [dict(zip(select, v, strict=True)) for v in itertools.product(*select.values())]
        office[_configs(c["method"], core_params(c.get("params", {})), grid)] = c["label"]
    root = Path(__file__).resolve().parents[1] / "studies"
    matched = 0
    for name in ("office_caltech10.toml", "office_caltech10_prior.toml"):
        for m in load_spec(root / name).methods:
            if m.select == "auto":
                assert m.label == office["auto"], (name, m.label)
                continue
            if m.method not in METHODS or m.grid:
                continue
            grid = [
                dict(zip(m.select, v, strict=True)) for v in itertools.product(*m.select.values())
            ]
            key = _configs(m.method, core_params(m.params), grid if m.select else [])
            if key in office:
                assert m.label == office[key], (name, m.label)
                matched += 1
    assert matched == 12  # 7 of office_caltech10.toml, 5 of office_caltech10_prior.toml


def test_bar_plot_legend_covers_no_bar():
    from mmdtl2_dist.study.report import by_pair_figure

    labels = [f"method {i}" for i in range(9)]
    rows = [
        {"pair": p, "label": lab, "mean": 100.0 - 3 * i, "std": 1.0}
        for p in ("a->b", "c->d", "all pairs")
        for i, lab in enumerate(labels)
    ]
    fig = by_pair_figure(pd.DataFrame(rows), labels, "tall bars")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches]
    assert bars and not any(legend.overlaps(b) for b in bars)
    assert not legend.overlaps(ax.get_window_extent())


def test_caption_names_only_the_reference_columns_the_table_has():
    from mmdtl2_dist.study.report import caption

    both = caption(20, "source SVM", "target SVM")
    assert "`**`/`*` better than source SVM, `++`/`+` better than target SVM." in both
    one = caption(4, None, "target SVM")
    assert one.endswith("p < 0.01/0.05: `++`/`+` better than target SVM.") and "`**`" not in one
    assert (
        caption(4, None, None) == "Accuracy (%): mean ± standard deviation over 4 splits (ddof=1)."
    )
