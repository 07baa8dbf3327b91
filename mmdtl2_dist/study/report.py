"""Paper-style reports of a study: tables with Welch t-test marks, and plots.

Tables follow Tamaki et al. (Tables 1-3): rows are the numbers of labelled target samples
per class, columns the methods, cells ``mean ± std`` of the accuracy (in %) over the
splits. A cell is marked ``**`` / ``*`` when the method is better than the source SVM
column by a one-tailed Welch t-test at the 1 % / 5 % level, and ``++`` / ``+`` likewise
against the target SVM column (``scipy.stats.ttest_ind(a, ref, equal_var=False,
alternative="greater")``). Standard deviations use ``ddof=1`` (sample standard deviation;
the paper does not say which it used). The spread is the paper's: the standard deviation
of the split accuracies, what a new split is likely to give, from which the t-test's
standard error follows (``std / sqrt(n_splits)``). Every table states it in a caption
line (:func:`caption`). ``mmdtl2 office`` prints its table with the same functions
(:func:`pair_tables`, :func:`markdown_table`, :func:`caption`).

With several device pairs, each pair gets its own table, and an "all pairs" table uses,
for each split number, the accuracy averaged over the pairs (so the t-test still compares
``n_splits`` values per cell); a "per pair" table at each sample count has one row per
pair (as in Hoffman et al.'s Office-Caltech tables).

Configurations of a parameter grid (``grid`` in the spec) are reported in a separate
"parameter sweep" table and in accuracy-versus-parameter plots (the paper's Figures 6-7);
the main tables and the accuracy-versus-samples plots (Figures 3-5) hold the other
configurations.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

ALL_PAIRS = "all pairs"


def welch_pvalue(a: np.ndarray, ref: np.ndarray) -> float:
    """One-tailed Welch p-value of ``mean(a) > mean(ref)``; NaN when undefined.

    Undefined cases (fewer than two values on a side, or both sides constant) give NaN,
    and a NaN p-value never earns a mark.
    """
    a = np.asarray(a, dtype=float)
    ref = np.asarray(ref, dtype=float)
    if a.size < 2 or ref.size < 2:
        return math.nan
    if np.ptp(a) == 0 and np.ptp(ref) == 0:
        return math.nan
    with warnings.catch_warnings():
        # Nearly constant samples: scipy warns about precision; the p-value stands.
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, ref, equal_var=False, alternative="greater").pvalue)


def significance_marks(
    a: np.ndarray,
    source_ref: np.ndarray | None,
    target_ref: np.ndarray | None,
    levels: tuple[float, float] = (0.01, 0.05),
) -> str:
    """The paper's marks for one cell: ``**``/``*`` vs source SVM, ``++``/``+`` vs target SVM.

    Parameters
    ----------
    a : ndarray
        Accuracies of the cell (one per split).
    source_ref, target_ref : ndarray or None
        Accuracies of the reference columns on the same row (``None``: no mark).
    levels : (float, float)
        Significance levels of the double and the single mark.
    """
    out = []
    for ref, sym in ((source_ref, "*"), (target_ref, "+")):
        if ref is None:
            continue
        p = welch_pvalue(a, ref)
        if p < levels[0]:
            out.append(sym * 2)
        elif p < levels[1]:
            out.append(sym)
    return " ".join(out)


def results_frame(trials: list[dict]) -> pd.DataFrame:
    """One row per (trial, pair, split) from trial payloads (see ``study.trial``).

    ``pool_size`` is the prior's pool of a ``select = "auto"`` unit (empty otherwise),
    ``target_pool_size`` the target samples a method that uses unlabelled samples was
    given (labelled ones included; empty for the other methods).
    """
    rows = []
    for t in trials:
        for u in t["units"]:
            rows.append(
                {
                    "key": t["key"],
                    "label": t["label"],
                    "base_label": t["base_label"],
                    "method": t["method"],
                    "swept": json.dumps(t.get("swept", {}), sort_keys=True),
                    "n_per_class": t["n_per_class"],
                    "pair": u["pair"],
                    "split": u["split"],
                    "accuracy": u["accuracy"],
                    "fit_s": u.get("fit_s", math.nan),
                    "chosen": json.dumps(u.get("chosen") or {}, sort_keys=True),
                    "pool_size": u.get("pool_size"),
                    "target_pool_size": u.get("target_pool_size"),
                }
            )
    cols = [
        "key",
        "label",
        "base_label",
        "method",
        "swept",
        "n_per_class",
        "pair",
        "split",
        "accuracy",
        "fit_s",
        "chosen",
        "pool_size",
        "target_pool_size",
    ]
    return pd.DataFrame(rows, columns=cols)


def _with_all_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """Add pseudo-pair ``ALL_PAIRS``: per split number, the mean over pairs."""
    if df["pair"].nunique() <= 1:
        return df
    agg = df.groupby(
        ["label", "base_label", "method", "swept", "n_per_class", "split"], as_index=False
    )["accuracy"].mean()
    agg["pair"] = ALL_PAIRS
    return pd.concat([df, agg], ignore_index=True)


def references(
    labels: list[str], methods: dict[str, str], source: str | None = None, target: str | None = None
) -> tuple[str | None, str | None]:
    """Reference columns: the given labels, else the first source/target SVM column."""

    def first(method):
        return next((lab for lab in labels if methods[lab] == method), None)

    return source or first("source_svm"), target or first("target_svm")


def paper_table(
    df: pd.DataFrame, pair: str, labels: list[str], ref_source: str | None, ref_target: str | None
) -> pd.DataFrame:
    """The table of one pair: rows = samples per class, columns = ``labels``.

    Returns a frame with a MultiIndex-free layout: one row per (n, label) with ``mean``,
    ``std`` (in %), ``n_splits``, ``p_source``, ``p_target`` and ``marks``.
    """
    d = df[df["pair"] == pair]
    out = []
    for n in sorted(d["n_per_class"].unique()):
        dn = d[d["n_per_class"] == n]

        def acc(label, dn=dn):
            v = dn.loc[dn["label"] == label].sort_values("split")["accuracy"].to_numpy()
            return v if v.size else None

        src = acc(ref_source) if ref_source else None
        tgt = acc(ref_target) if ref_target else None
        for label in labels:
            a = acc(label)
            if a is None:
                continue
            ps = welch_pvalue(a, src) if src is not None and label != ref_source else math.nan
            pt = welch_pvalue(a, tgt) if tgt is not None and label != ref_target else math.nan
            marks = significance_marks(
                a, src if label != ref_source else None, tgt if label != ref_target else None
            )
            out.append(
                {
                    "pair": pair,
                    "n_per_class": int(n),
                    "label": label,
                    "mean": 100 * float(np.mean(a)),
                    "std": 100 * float(np.std(a, ddof=1)) if a.size > 1 else 0.0,
                    "n_splits": int(a.size),
                    "p_source": ps,
                    "p_target": pt,
                    "marks": marks,
                }
            )
    return pd.DataFrame(out)


def pair_tables(
    df: pd.DataFrame, labels: list[str], ref_source: str | None, ref_target: str | None
) -> pd.DataFrame:
    """:func:`paper_table` of every pair, and of ``ALL_PAIRS`` when there are several."""
    full = _with_all_pairs(df)
    pairs = list(dict.fromkeys(df["pair"]))
    tables = [
        paper_table(full, pair, labels, ref_source, ref_target)
        for pair in pairs + ([ALL_PAIRS] if len(pairs) > 1 else [])
    ]
    return pd.concat(tables, ignore_index=True)


def caption(n_splits: int, ref_source: str | None, ref_target: str | None) -> str:
    """The line that says what a table's cells are: the spread and the t-test marks."""
    if n_splits == 1:  # no spread, and no test, from one split
        return "Accuracy (%) of one split: no standard deviation or t-test from a single split."
    marks = [
        f"{m} better than {ref}"
        for m, ref in (("`**`/`*`", ref_source), ("`++`/`+`", ref_target))
        if ref
    ]
    tests = f" One-tailed Welch t-test at p < 0.01/0.05: {', '.join(marks)}." if marks else ""
    return f"Accuracy (%): mean ± standard deviation over {n_splits} splits (ddof=1).{tests}"


def _cell(r) -> str:
    s = f"{r['mean']:.2f}" + (f" ± {r['std']:.2f}" if r["n_splits"] > 1 else "")
    return f"{s} {r['marks']}" if r["marks"] else s


def markdown_table(table: pd.DataFrame, row: str, labels: list[str]) -> str:
    """Render a long table (from :func:`paper_table`) as Markdown, rows by ``row``."""
    cols = [lab for lab in labels if lab in set(table["label"])]
    head = f"| {row} | " + " | ".join(cols) + " |"
    sep = "|---:|" + "---|" * len(cols)
    lines = [head, sep]
    for key, g in table.groupby(row, sort=False):
        cells = {r["label"]: _cell(r) for _, r in g.iterrows()}
        lines.append(f"| {key} | " + " | ".join(cells.get(c, "") for c in cols) + " |")
    return "\n".join(lines)


def _legend_outside(ax, fontsize: float = 8) -> None:
    """The legend right of the axes, where it covers no bar, line or error bar."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps the legend outside the axes
    plt.close(fig)


def _plot_vs_n(table: pd.DataFrame, labels: list[str], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        t = table[table["label"] == label].sort_values("n_per_class")
        if t.empty:
            continue
        ax.errorbar(
            t["n_per_class"], t["mean"], yerr=t["std"], marker="o", ms=3, capsize=2, label=label
        )
    ax.set_xlabel("labelled target samples per class")
    ax.set_ylabel("accuracy (%), mean ± std over splits")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)


def by_pair_figure(table: pd.DataFrame, labels: list[str], title: str):
    """Grouped bars: accuracy (mean ± std) of every method on every pair."""
    pairs = list(dict.fromkeys(table["pair"]))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(pairs)), 4.5))
    for i, label in enumerate(labels):
        t = table[table["label"] == label].set_index("pair").reindex(pairs)
        x = np.arange(len(pairs)) + (i - (len(labels) - 1) / 2) * width
        ax.bar(x, t["mean"], width, yerr=t["std"], capsize=1.5, label=label)
    ax.set_xticks(np.arange(len(pairs)), pairs, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%), mean ± std over splits")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    _legend_outside(ax, fontsize=7)
    return fig


def _plot_by_pair(table: pd.DataFrame, labels: list[str], title: str, path: Path) -> None:
    _save(by_pair_figure(table, labels, title), path)


def _plot_sweep(d: pd.DataFrame, base: str, param: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    d = d.assign(value=d["swept"].map(lambda s: json.loads(s)[param]))
    for n, g in d.groupby("n_per_class"):
        m = g.groupby("value")["accuracy"].agg(["mean", "std"]).sort_index()
        ax.errorbar(
            m.index.astype(float),
            100 * m["mean"],
            yerr=100 * m["std"].fillna(0),
            marker="o",
            ms=3,
            capsize=2,
            label=f"n = {n}",
        )
    vals = d["value"].astype(float)
    if (vals > 0).all() and vals.max() / vals.min() > 50:
        ax.set_xscale("log")
    ax.set_xlabel(param)
    ax.set_ylabel("accuracy (%), mean ± std over splits")
    ax.set_title(f"{base}: accuracy versus {param}")
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    _save(fig, path)


def _slug(s: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in s).lower()
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "x"


def _params_text(params: dict) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def chosen_summary(df: pd.DataFrame) -> pd.DataFrame:
    """For configurations with cross-validated parameters: how often each choice won."""
    d = df[df["chosen"] != "{}"]
    out = []
    for (label, n), g in d.groupby(["label", "n_per_class"]):
        counts = Counter(g["chosen"])
        total = sum(counts.values())
        text = "; ".join(
            f"{_params_text(json.loads(c))} ({m}/{total})" for c, m in counts.most_common()
        )
        out.append({"label": label, "n_per_class": int(n), "chosen": text})
    return pd.DataFrame(out, columns=["label", "n_per_class", "chosen"])


def _accuracy_sections(table, main, pairs, cap, title, out_dir, md, files) -> str | None:
    """Accuracy versus labelled samples per pair (and pooled), and per pair at each n.

    Appends the Markdown sections to ``md`` and the plots to ``files``; returns the
    summary table (the pooled or only pair's; per pair when there is one n).
    """
    summary = None
    main_pair = ALL_PAIRS if len(pairs) > 1 else pairs[0]
    for pair in ([ALL_PAIRS] if len(pairs) > 1 else []) + pairs:
        t = table[(table["pair"] == pair) & table["label"].isin(main)]
        heading = "All pairs (per split, mean over pairs)" if pair == ALL_PAIRS else f"{pair}"
        text = markdown_table(t, "n_per_class", main)
        md += [f"## {heading}", "", cap, "", text, ""]
        if pair == main_pair:
            summary = f"{heading}\n\n{cap}\n\n{text}"
        png = out_dir / f"accuracy_vs_n_{_slug(pair)}.png"
        if t["n_per_class"].nunique() > 1:
            _plot_vs_n(t, main, f"{title}: {heading}", png)
            files.append(png)
    if len(pairs) > 1:
        for n in sorted(table["n_per_class"].unique()):
            t = table[(table["n_per_class"] == n) & table["label"].isin(main)]
            text = markdown_table(t, "pair", main)
            md += [f"## Per pair, {n} labelled target samples per class", "", cap, "", text, ""]
            if table["n_per_class"].nunique() == 1:  # no accuracy-versus-n curve to draw
                png = out_dir / f"accuracy_by_pair_n{n}.png"
                _plot_by_pair(t, main, f"{title}: {n} labelled target samples per class", png)
                files.append(png)
                summary = f"Per pair, {n} labelled target samples per class\n\n{cap}\n\n{text}"
    return summary


def _sweep_sections(df, full, table, pairs, cap, out_dir, md, files) -> None:
    """One section (and, for one swept parameter, a plot) per method with a grid."""
    main_pair = ALL_PAIRS if len(pairs) > 1 else pairs[0]
    swept = df[df["swept"] != "{}"]
    for base, g in swept.groupby("base_label", sort=False):
        params = sorted({k for s in g["swept"] for k in json.loads(s)})
        labels = list(dict.fromkeys(g["label"]))
        t = table[(table["pair"] == main_pair) & table["label"].isin(labels)]
        sweep = markdown_table(t, "n_per_class", labels)
        md += [f"## Parameter sweep: {base}", "", cap, "", sweep, ""]
        if len(params) == 1:
            png = out_dir / f"sweep_{_slug(base)}_{params[0]}.png"
            pooled = (
                g
                if len(pairs) == 1
                else full[(full["pair"] == ALL_PAIRS) & full["label"].isin(labels)]
            )
            _plot_sweep(pooled, base, params[0], png)
            files.append(png)


def _chosen_section(df, out_dir, md, files) -> None:
    """The configurations chosen by cross-validation, and ``chosen_params.csv``."""
    chosen = chosen_summary(df)
    if chosen.empty:
        return
    md += [
        "## Parameters chosen by cross-validation on the labelled target samples",
        "",
        "| method | n | chosen (splits × pairs) |",
        "|---|---:|---|",
    ]
    md += [f"| {r.label} | {r.n_per_class} | {r.chosen} |" for r in chosen.itertuples()]
    md.append("")
    chosen.to_csv(out_dir / "chosen_params.csv", index=False)
    files.append(out_dir / "chosen_params.csv")


def write_report(
    trials: list[dict],
    out_dir: Path,
    *,
    title: str,
    ref_source: str | None = None,
    ref_target: str | None = None,
    label_order: list[str] | None = None,
    timing: dict | None = None,
) -> dict:
    """Write ``report.md``, ``results.csv``, ``table.csv`` and PNG plots to ``out_dir``.

    Parameters
    ----------
    trials : list of dict
        Trial payloads.
    out_dir : Path
        Report folder (created).
    title : str
        Report title.
    ref_source, ref_target : str, optional
        Labels of the reference columns (default: first source / target SVM column).
    label_order : list of str, optional
        Column order (default: order of first appearance).
    timing : dict, optional
        Timings to show (``study_wall_s``, ``solver_s``, ...).

    Returns
    -------
    dict
        ``markdown`` (the report text), ``summary`` (the main table, Markdown), ``files``
        (paths written).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    df = results_frame(trials)
    if df.empty:
        raise ValueError("no trial results to report; run the study first.")
    files = []
    df.to_csv(out_dir / "results.csv", index=False)
    files.append(out_dir / "results.csv")
    order = label_order or list(dict.fromkeys(df["label"]))
    methods = dict(zip(df["label"], df["method"], strict=False))
    main = [lab for lab in order if lab in set(df.loc[df["swept"] == "{}", "label"])]
    rs, rt = references(main, methods, ref_source, ref_target)
    full = _with_all_pairs(df)
    pairs = list(dict.fromkeys(df["pair"]))
    table = pair_tables(df, order, rs, rt)
    table.to_csv(out_dir / "table.csv", index=False)
    files.append(out_dir / "table.csv")

    cap = caption(df["split"].nunique(), rs, rt)
    md = [f"# {title}", ""]
    summary = _accuracy_sections(table, main, pairs, cap, title, out_dir, md, files)
    _sweep_sections(df, full, table, pairs, cap, out_dir, md, files)
    _chosen_section(df, out_dir, md, files)
    if timing:
        md += ["## Timing", "", "| quantity | value |", "|---|---:|"]
        md += [
            f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in timing.items()
        ]
        md.append("")
    text = "\n".join(md)
    (out_dir / "report.md").write_text(text)
    files.insert(0, out_dir / "report.md")
    return {"markdown": text, "summary": summary or text, "files": files, "table": table}
