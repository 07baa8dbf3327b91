"""`mmdtl2 office` prints the numbers of the stored run, and those of a study, to the last bit.

    python benchmarks/check_office_numbers.py                    # 12 shifts x 20 splits
    python benchmarks/check_office_numbers.py --trials 2 --shifts dslr-webcam
    python benchmarks/check_office_numbers.py --office-out DIR --study STUDY_DIR ...

Runs ``mmdtl2 office --out`` (or reads an earlier ``--office-out`` folder) and compares,
split by split, every column's accuracy and the CV column's chosen configuration with
the stored full run (``benchmarks/results/office_caltech10.json``; its CV-selected column
equals ``office_caltech10_cv_selected.json``, that column's own run), and with the
``results.csv`` of each ``--study`` folder for the columns that run the same
configuration (method and parameters, whatever their label; e.g. the bundled
``studies/office_caltech10.toml`` and ``office_caltech10_prior.toml``). Prints one row
per column: splits equal bit for bit, and the 12-shift mean as the README's table
prints it (one decimal) for each source; exits 1 if any split differs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmdtl2_dist.cli import main as cli  # noqa: E402
from mmdtl2_dist.core.methods import default_params  # noqa: E402
from mmdtl2_dist.office import COLUMNS  # noqa: E402
from mmdtl2_dist.study.spec import core_params  # noqa: E402

STORED = ROOT / "benchmarks" / "results"


def stored_runs() -> tuple[dict, dict]:
    """Per-split accuracies and choices of the stored full run, keyed "s-t|label"."""
    stored = json.loads((STORED / "office_caltech10.json").read_text())
    return stored["acc"], stored["chosen"]


def config_key(method: str, params: dict, select: dict | str) -> str:
    """A column's full configuration: method, every parameter, the CV grid (or "auto")."""
    grid = select if isinstance(select, str) else [
        dict(zip(select, v, strict=True)) for v in itertools.product(*select.values())
    ]  # fmt: skip
    full = {**default_params(method), **core_params(params)} if method in _CORE else params
    return json.dumps([method, full, grid], sort_keys=True, default=str)


_CORE = {"source_svm", "target_svm", "mmdt", "mmdt_hoffman", "mmdtl2"}


def study_accuracies(folder: Path) -> dict:
    """``{config key: {"s-t": [accuracy per split]}}`` of a study folder's results."""
    df = pd.read_csv(folder / "report" / "results.csv")
    payloads = {json.loads(p.read_text())["key"]: p for p in (folder / "results").glob("*.json")}
    out = {}
    for key, g in df.groupby("key"):
        p = json.loads(payloads[key].read_text())
        ck = config_key(p["method"], p["params"], p.get("select") or {})
        for pair, h in g.groupby("pair"):
            acc = h.sort_values("split")["accuracy"].to_list()
            out.setdefault(ck, {})[pair.replace("->", "-")] = acc
    return out


def compare(new: dict, ref: dict) -> tuple[int, int]:
    """Splits equal bit for bit, and splits compared, between two "s-t" -> list maps."""
    same = total = 0
    for shift, values in new.items():
        if shift in ref:
            theirs = ref[shift][: len(values)]
            same += sum(a == b for a, b in zip(values, theirs, strict=True))
            total += len(values)
    return same, total


def mean_line(per_shift: dict) -> str:
    return f"{100 * np.mean([np.mean(v) for v in per_shift.values()]):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--shifts", nargs="+", default=None)
    ap.add_argument("--office-out", type=Path, help="an earlier `mmdtl2 office --out` folder")
    ap.add_argument("--study", type=Path, nargs="*", default=[], help="study folders")
    args = ap.parse_args()
    out = args.office_out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="check_office_"))
        cmd = ["office", "--trials", str(args.trials), "--out", str(out), "-q"]
        if args.shifts:
            cmd += ["--shifts", *args.shifts]
        if cli(cmd) != 0:
            return 1
    got = json.loads((out / "office_caltech10.json").read_text())
    acc, chosen = stored_runs()
    studies = {p: study_accuracies(p) for p in args.study}
    bad = 0
    print("| column | splits equal to the stored run | mean: office / stored | studies |")
    print("|---|---|---|---|")
    for c in COLUMNS:
        mine = {k.split("|")[0]: v for k, v in got["acc"].items() if k.endswith(f"|{c['label']}")}
        if not mine:
            continue
        ref = {k.split("|")[0]: v for k, v in acc.items() if k.endswith(f"|{c['label']}")}
        same, total = compare(mine, ref)
        ch = got["chosen"]
        same_ch = sum(
            ch[k][s] == chosen[k][s]
            for k in ch
            if k.endswith(f"|{c['label']}") and k in chosen
            for s in ch[k]
        )
        ck = config_key(c["method"], c.get("params", {}), c.get("select", {}))
        cells = []
        for path, found in studies.items():
            if ck in found:
                s_same, s_total = compare(mine, found[ck])
                bad += s_total - s_same
                cells.append(f"{path.name}: {s_same}/{s_total}")
        bad += total - same
        ref_means = {k: v[: len(mine[k])] for k, v in ref.items() if k in mine}
        extra = f", CV choices {same_ch} equal" if c.get("select") else ""
        stored = mean_line(ref_means) if ref_means else "not stored"
        print(
            f"| {c['label']} | {same}/{total}{extra} | {mean_line(mine)} / "
            f"{stored} | {'; '.join(cells) or '-'} |"
        )
    print(f"\n{'every split equal' if not bad else f'{bad} splits differ'} (office output: {out})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
