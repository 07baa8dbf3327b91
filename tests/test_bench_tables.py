"""The harnesses of benchmarks/ (final tables on deep features and Hoffman's splits, the
selection rule's dev study), tiny runs.

They live in the checkout, not in the package: these tests import the scripts from
``benchmarks/``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # worker processes unpickle its functions by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def deep():
    return _script("bench_deep_table")


def test_recommended_column_gets_the_test_features_unlabelled_never_their_labels(deep, monkeypatch):
    from mmdtl2_dist import estimators

    seen = {}

    class Spy:
        def __init__(self, **params):
            seen["params"] = params

        def fit(self, X, y, *, sample_domain):
            seen.update(X=X, y=y, sd=sample_domain)
            return self

        def predict(self, X):
            seen["Xq"] = X
            return np.ones(len(X), dtype=int)

    monkeypatch.setattr(estimators, "Spy", Spy, raising=False)
    Xs, ys, Xl, yl, Xq, yq = deep.split_data("decaf6", "webcam", "dslr", 0)
    y_pred = deep.estimator_predict("Spy", {"select": "auto"}, Xs, ys, Xl, yl, Xq)
    assert seen["params"] == {"select": "auto"} and len(y_pred) == len(yq)
    n_s, n_l = len(ys), len(yl)
    assert len(seen["y"]) == n_s + n_l + len(Xq)
    np.testing.assert_array_equal(seen["y"][: n_s + n_l], np.concatenate([ys, yl]))
    assert np.all(seen["y"][n_s + n_l :] == -1)  # the test rows: unlabelled
    assert np.all(seen["sd"][:n_s] == 1) and np.all(seen["sd"][n_s:] == -1)
    np.testing.assert_array_equal(seen["X"][n_s + n_l :], Xq)
    # Hoffman's sizes: 8 source images per class from webcam, 3 labelled per class.
    assert (n_s, n_l, len(Xq)) == (80, 30, 157 - 30)


def test_unknown_recommended_estimator_names_the_fix(deep):
    with pytest.raises(ValueError, match=r"no 'NoSuch'.*--recommended 'CLASS:\{json params\}'"):
        deep.estimator_predict("NoSuch", {}, *([np.zeros((2, 2))] * 2 + [None] * 3))


def test_deep_table_writes_markdown_and_json(deep, tmp_path):
    out = tmp_path / "deep"
    argv = ["--splits", "2", "--feature-sets", "decaf6", "--columns", "source SVM",
            "target SVM", "--out", str(out)]  # fmt: skip
    assert deep.main(argv) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert set(res["acc"]) == {"decaf6 W→D", "decaf6 D→W"}
    assert all(len(v) == 2 for cell in res["acc"].values() for v in cell.values())
    assert res["meta"]["seed"] == 2028
    text = out.with_suffix(".md").read_text()
    assert "| shifts within one SE of max(source, target) |" in text
    assert "'source SVM'" in text  # the command as it can be pasted


def test_deep_table_refuses_a_bad_recommended_spec(deep):
    with pytest.raises(SystemExit, match="must be a JSON object"):
        deep.main(["--recommended", "MMDTL2:{select: auto}", "--splits", "2"])


@pytest.fixture(scope="module")
def final():
    return _script("office_final_table")


def test_recommended_office_column_is_found_by_its_auto_selection(final):
    cols = [
        {"label": "source SVM", "method": "source_svm"},
        {"label": "MMDTL2 CV-selected", "method": "mmdtl2", "select": {"prior_weight": [0.0]}},
        {"label": "MMDTL2 (auto)", "method": "mmdtl2", "params": {"select": "auto"}},
    ]
    assert final.recommended_label(cols) == "MMDTL2 (auto)"
    assert final.recommended_label([*cols[:2], {"label": "x", "select": "auto"}]) == "x"
    with pytest.raises(SystemExit, match=r"no office column is marked.*name it with --column"):
        final.recommended_label(cols[:2])


def test_final_office_table_runs_mmdtl2_office_and_counts_shifts_below(final, tmp_path):
    out = tmp_path / "final"
    argv = ["--column", "MMDTL2 identity prior", "--trials", "2", "--shifts", "dslr-webcam",
            "amazon-dslr", "--workers", "2", "--out", str(out), "--office-out",
            str(tmp_path / "office")]  # fmt: skip
    assert final.main(argv) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["shift"] for r in res["rows"]] == ["amazon-dslr", "dslr-webcam"]
    for r in res["rows"]:
        assert r["max"] == max(r["source SVM"], r["target SVM"]) and r["splits"] == 2
        assert r["MMDTL2 identity prior"]["gap"] == pytest.approx(
            r["MMDTL2 identity prior"]["mean"] - r["max"]
        )
    s = res["summary"]["MMDTL2 identity prior"]
    below = [r["shift"] for r in res["rows"] if r["MMDTL2 identity prior"]["gap"] < -1.0]
    assert s["more_than_1_point_below"] == below
    text = out.with_suffix(".md").read_text()
    assert f"shifts more than 1 point below max(source, target): **{len(below)}/2**" in text
    assert "12-shift mean" not in text and "2-shift mean" in text
    assert "targets: not judged (2 shifts x 2 splits; they need 12 x 20)" in text
    # The same table from the office run's folder, without running it again.
    office = tmp_path / "office"
    again = tmp_path / "again"
    argv2 = ["--column", "MMDTL2 identity prior", "--office-out", str(office), "--out", str(again)]
    assert final.main(argv2) == 0
    assert json.loads(again.with_suffix(".json").read_text())["rows"] == res["rows"]
    with pytest.raises(SystemExit, match=r"no column 'MMDTL2 RBF'; they have \["):
        final.main(["--column", "MMDTL2 RBF", "--office-out", str(office), "--out", str(again)])


def test_final_table_reads_a_study_and_finds_its_auto_column(final, tmp_path):
    """The main job's study (source/target SVM, ``select = "auto"``) gives the same table,
    from the trials of the study's spec only: a result kept from an earlier rule version
    (same label, another trial key) is not mixed in."""
    from mmdtl2_dist.study.spec import parse_spec

    raw = {
        "study": {"name": "final"},
        "data": {"builtin": "office_caltech10", "space": "surf800",
                 "pairs": [["amazon", "webcam"], ["webcam", "dslr"]]},
        "splits": {"protocol": "fixed", "samples_per_class": [3]},
        "methods": [{"label": "source SVM", "method": "source_svm"},
                    {"label": "target SVM", "method": "target_svm"},
                    {"label": "MMDTL2 auto", "method": "mmdtl2", "select": "auto"}],
    }  # fmt: skip
    folder = tmp_path / "study"
    (folder / "results").mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"raw": raw, "spec_path": None}))
    trials = parse_spec(raw, None, output=folder).trials()
    accs = {"source SVM": (0.40, 0.50), "target SVM": (0.45, 0.40), "MMDTL2 auto": (0.47, 0.48)}
    keys = [t.key for t in trials] + ["an-earlier-rule"]
    stale = ("MMDTL2 auto", (0.1, 0.1))
    for key, (label, (a, b)) in zip(keys, [*accs.items(), stale], strict=True):
        units = [
            {"pair": pair, "split": k, "accuracy": acc + 0.01 * k}
            for pair, acc in (("amazon->webcam", a), ("webcam->dslr", b))
            for k in (1, 0)  # stored out of order: read in split order
        ]
        select = "auto" if label == "MMDTL2 auto" else {}
        payload = {"label": label, "params": {}, "select": select, "units": units}
        (folder / "results" / f"{key}.json").write_text(json.dumps(payload))
    out = tmp_path / "final"
    assert final.main(["--study", str(folder), "--out", str(out)]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["label"] == "MMDTL2 auto"
    rows = {r["shift"]: r for r in res["rows"]}
    assert rows["amazon-webcam"]["max"] == pytest.approx(45.5)
    assert rows["amazon-webcam"]["MMDTL2 auto"]["gap"] == pytest.approx(2.0)
    assert rows["webcam-dslr"]["MMDTL2 auto"]["gap"] == pytest.approx(-2.0)
    assert res["summary"]["MMDTL2 auto"]["more_than_1_point_below"] == ["webcam-dslr"]
    (folder / "results" / f"{trials[0].key}.json").unlink()
    with pytest.raises(SystemExit, match=r"1 of the study's 3 trials have no results; finish"):
        final.main(["--study", str(folder), "--out", str(out)])
    with pytest.raises(SystemExit, match="is not a study folder"):
        final.main(["--study", str(tmp_path), "--out", str(out)])
    (folder / "study.json").write_text("{}")
    with pytest.raises(SystemExit, match="cannot be read as a study"):
        final.main(["--study", str(folder), "--out", str(out)])


def test_deep_table_without_the_reference_columns_has_no_max_column(deep):
    acc = {"decaf6 W→D": {"recommended": [0.9, 0.92]}, "decaf6 D→W": {"recommended": [0.8, 0.8]}}
    text = deep.format_table(deep.summarise(acc, ["recommended"]), ["recommended"], 2)
    assert "| **mean** | **85.5** |" in text and "max(source, target)" not in text


@pytest.fixture(scope="module")
def rule_dev():
    return _script("bench_rule_dev")


def test_agreeing_rows_drop_a_row_where_one_fold_fit_disagrees(rule_dev):
    fold_1 = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    fold_2 = np.array([[1.0, 0.5, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.2, 0.0]])
    fold_3 = np.array([[3.0, 0.0, 1.0], [0.0, 0.5, 0.0], [0.0, 1.0, 2.0], [2.0, 0.0, 0.0]])
    # row 3: folds 1 and 3 and the mean predict class 0, fold 2 class 1
    mask = rule_dev.agreeing_rows([fold_1, fold_2, fold_3])
    assert mask.dtype == bool
    assert mask.tolist() == [True, True, True, False]


def test_agreeing_rows_drop_a_row_where_the_folds_agree_with_each_other_only_in_part(rule_dev):
    # every fold predicts a different class: no class is shared, the mean's is not all folds'
    folds = [np.array([[3.0, 0.0, 0.0]]), np.array([[0.0, 2.0, 0.0]]), np.array([[0.0, 0.0, 2.5]])]
    assert rule_dev.agreeing_rows(folds).tolist() == [False]


def test_stf2a_takes_only_eligible_rows_and_fewer_when_fewer_are_eligible(rule_dev, monkeypatch):
    monkeypatch.setattr(rule_dev, "with_pseudo_labels", lambda pool, yt, rows, labels: (pool, yt))
    scores = np.array([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # rows 0-2 class 0
    yt = np.array([0, 1])
    eligible = np.array([False, True, True, True])
    *_, rows, labels = rule_dev.pseudo_labelled(None, None, yt, scores, np.array([0, 1]), 2)
    assert rows.tolist() == [0, 1, 3]  # 2 per class: rows 0, 1 of class 0 and the 1 of class 1
    *_, rows, labels = rule_dev.pseudo_labelled(
        None, None, yt, scores, np.array([0, 1]), 2, eligible
    )
    assert rows.tolist() == [1, 2, 3]  # row 0 not eligible: the next largest margin, row 2
    assert labels.tolist() == [0, 0, 1]


def test_class_subset_keeps_the_same_drawn_classes_on_both_domains(rule_dev):
    ys, yt = np.repeat(np.arange(1, 11), 4), np.repeat(np.arange(1, 11), 6)
    keep_s, keep_t = rule_dev.class_subset(ys, yt, "amazon", "webcam", 0, 2027, 3)
    assert len(set(ys[keep_s])) == 3 and set(ys[keep_s]) == set(yt[keep_t])
    assert len(keep_s) == 12 and len(keep_t) == 18  # every row of the kept classes
    again = rule_dev.class_subset(ys, yt, "amazon", "webcam", 1, 2027, 3)
    assert set(ys[again[0]]) != set(ys[keep_s])  # drawn per split


def test_split_rows_with_more_source_per_class_than_a_class_has_take_all_of_it(rule_dev):
    ys = np.r_[np.zeros(5, int), np.ones(30, int)]
    yt = np.repeat([0, 1], 10)
    src, lab, test = rule_dev.split_rows(ys, yt, "amazon", "webcam", 0, 2027, 3, 1000)
    assert sorted(src.tolist()) == list(range(35))
    assert len(lab) == 6 and len(test) == 14 and not set(lab) & set(test)
    src20, *_ = rule_dev.split_rows(ys, yt, "amazon", "webcam", 0, 2027, 3, 20)
    assert np.bincount(ys[src20]).tolist() == [5, 20]


def test_a_varied_protocol_is_its_own_label_budget(rule_dev):
    plain, varied = (
        ("surf", "amazon", "webcam", 0, 3),
        ("surf", "amazon", "webcam", 0, 3, {"classes": 2}),
    )
    assert rule_dev.budget(plain) == 3
    assert rule_dev.budget_name(rule_dev.budget(varied)) == "3, 2 classes"


def test_split_rows_on_the_design_protocol_are_bench_selections_rows(rule_dev):
    selection = _script("bench_selection")
    rng = np.random.default_rng(0)
    ys, yt = np.repeat(np.arange(1, 11), 25)[rng.permutation(250)], np.repeat(np.arange(1, 11), 9)
    for source, k in (("amazon", 0), ("webcam", 3)):
        ours = rule_dev.split_rows(ys, yt, source, "dslr", k, 2027, 3)
        theirs = selection.random_split_rows(ys, yt, source, "dslr", k, 2027)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_varied_budgets_sort_by_their_numbers_after_the_plain_ones(rule_dev):
    keys = [(("10 classes"), 3), ("2 classes", 10), 3, ("2 classes", 3), 1]
    assert sorted(keys, key=rule_dev.budget_order) == [
        1,
        3,
        ("2 classes", 3),
        ("2 classes", 10),
        ("10 classes", 3),
    ]


def test_cost_model_benchmark_predicts_each_gpu_plan_from_the_other(tmp_path):
    cost = _script("bench_cost_model")
    stored = ROOT / "benchmarks" / "results" / "gram_gpu_h200.json"
    result = tmp_path / "gram_gpu.json"
    result.write_text(stored.read_text())
    assert cost.main([str(result)]) == 0
    rows = cost.predictions(json.loads(stored.read_text()))
    assert {(r["precision"], r["calibrated_on"], r["predicted"]) for r in rows} == {
        (p, a, b) for p in ("float64", "mixed") for a, b in ((5120, 10240), (10240, 5120))
    }
    # the GPU terms (write rate, overlapped copies) bring every prediction closer
    assert all(
        abs(r["model_s"] - r["measured_s"]) < abs(r["cpu_form_s"] - r["measured_s"]) for r in rows
    )
    assert (
        "| float64 | 5,120 rows | 10,240 rows | 5.39 s |"
        in (tmp_path / "gram_gpu_cost_model.md").read_text()
    )
