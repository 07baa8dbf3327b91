"""`mmdtl2 office`'s protocol with the CV-selected column (issue 8), on the bundled data."""

import numpy as np

from mmdtl2_dist.core.methods import fit_predict
from mmdtl2_dist.core.selection import PRIOR_WEIGHTS, select_by_cv
from mmdtl2_dist.office import DEFAULT_COLUMNS, NAMED_GRIDS, run_protocol, split_problem


def test_cv_selected_column_reports_its_choice_and_reproduces_it():
    """Per split, the column reports the weight CV chose on the labelled targets alone,
    and its accuracy is that of the chosen configuration fitted on the whole split:
    an independent select_by_cv + fit_predict on the same split gives both again."""
    col = next(c for c in DEFAULT_COLUMNS if c.label == "MMDTL2 CV-selected")
    shift, trials = ("dslr", "webcam"), [0, 1]
    res = run_protocol([col], [shift], trials, workers=1, progress=False)
    chosen = res["chosen"][(shift, col.label)]
    for k in trials:
        assert chosen[k]["prior_weight"] in PRIOR_WEIGHTS and chosen[k]["c_f"] == 1.0
        prob, yq = split_problem(*shift, k)
        # select_by_cv reads only the source and labelled target blocks of the split.
        grid = [{"c_f": 1.0, **g} for g in NAMED_GRIDS["prior_weight"]]
        best, table = select_by_cv("mmdtl2", grid, prob)
        assert best == chosen[k]
        assert {r["criterion"] for r in table} == {"hinge"}
        acc = float(np.mean(fit_predict("mmdtl2", best, prob).y_pred == yq))
        assert res["acc"][(shift, col.label)][k] == acc
