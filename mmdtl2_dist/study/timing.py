"""The timing of a study: wall-clock stages, trial CPU time and idle CPUs."""

from __future__ import annotations


def cpu_accounting(
    intervals: list[tuple[float, float, int]], t0: float, t1: float, cpus: float
) -> dict[str, float]:
    """Split the CPU time of a trial phase into trials running and idle CPUs.

    Parameters
    ----------
    intervals : list of (start, end, cpus)
        Epoch seconds of each trial and the CPUs it holds.
    t0, t1 : float
        The trial phase (epoch seconds).
    cpus : float
        CPUs of the cluster.

    Returns
    -------
    dict
        ``capacity_cpu_s`` (``cpus * (t1 - t0)``) = ``in_trials_cpu_s`` (CPUs held by
        running trials) + ``scheduling_idle_cpu_s`` (idle while some trial had not
        started yet: the executor's start-up (Ray Tune and its actors, or worker
        processes), result handling and driver-side MLflow logging) +
        ``tail_idle_cpu_s`` (idle after the last trial started: too few trials left to
        fill the CPUs, i.e. load imbalance).
    """
    last_start = max((a for a, _, _ in intervals), default=t0)
    edges = sorted({t0, t1, *(min(max(x, t0), t1) for a, b, _ in intervals for x in (a, b))})
    held = sched = tail = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=False):
        mid = 0.5 * (a + b)
        busy = min(float(sum(c for s, e, c in intervals if s <= mid < e)), cpus)
        held += busy * (b - a)
        idle = (cpus - busy) * (b - a)
        if mid < last_start:
            sched += idle
        else:
            tail += idle
    return {
        "capacity_cpu_s": cpus * (t1 - t0),
        "in_trials_cpu_s": held,
        "scheduling_idle_cpu_s": sched,
        "tail_idle_cpu_s": tail,
    }


def study_timing(payloads: list[dict], timing: dict) -> dict:
    """Timings of a study: its stages, and where the CPU time of the trial phase went.

    ``solver_cpu_s`` is the sum of the method fits (what the study is for),
    ``gram_slicing_cpu_s`` the sum of loading and slicing cached Gram blocks, and
    ``trial_other_cpu_s`` the rest of the CPU time held by trials (per-trial set-up, and
    CPUs of a trial waiting for its slowest share). Everything else is framework or
    scheduling: see :func:`cpu_accounting`. ``solver_share`` is ``solver_cpu_s`` over
    ``capacity_cpu_s``.
    """
    out = {
        "trials": len(payloads),
        "fits": sum(len(p["units"]) for p in payloads),
        "solver_cpu_s": float(sum(p["solver_s"] for p in payloads)),
        "gram_slicing_cpu_s": float(sum(p.get("slice_s", p.get("load_s", 0.0)) for p in payloads)),
    }
    t0, t1, cpus = timing.get("trials_t0"), timing.get("trials_t1"), timing.get("cpus")
    if t0 and t1 and cpus:
        # Only trials of this run's trial phase (a resumed study also holds older ones).
        mine = [p for p in payloads if "t_start" in p and t0 - 1 <= p["t_start"] <= t1]
        acc = cpu_accounting(
            [(p["t_start"], p["t_end"], int(p.get("cpus", 1))) for p in mine], t0, t1, cpus
        )
        solver = float(sum(p["solver_s"] for p in mine))
        slicing = float(sum(p.get("slice_s", 0.0) for p in mine))
        acc["trials_this_run"] = len(mine)
        acc["solver_cpu_s_this_run"] = solver
        acc["gram_slicing_cpu_s_this_run"] = slicing
        acc["trial_other_cpu_s"] = max(acc["in_trials_cpu_s"] - solver - slicing, 0.0)
        acc["solver_share"] = solver / acc["capacity_cpu_s"] if acc["capacity_cpu_s"] else 0.0
        out.update(acc)
    return {**{k: v for k, v in timing.items() if k not in ("trials_t0", "trials_t1")}, **out}


def timing_line(t: dict, stages: dict) -> str:
    """One line of the study's timing for the progress output."""
    line = (
        f"{stages.get('study_wall_s', 0):.0f} s wall ({stages.get('executor', '?')} executor "
        f"start {stages.get('executor_start_s', 0):.0f} s, data + Gram "
        f"{stages.get('data_and_gram_s', 0):.0f} s, trials {stages.get('trials_wall_s', 0):.0f}"
        f" s, report {stages.get('report_s', 0):.0f} s)"
    )
    if "capacity_cpu_s" in t:
        line += (
            f"; trial phase {t['capacity_cpu_s']:.0f} CPU-s = fits {t['solver_cpu_s_this_run']:.0f}"
            f" + Gram slicing {t['gram_slicing_cpu_s_this_run']:.0f} + other in-trial "
            f"{t['trial_other_cpu_s']:.0f} + scheduling idle {t['scheduling_idle_cpu_s']:.0f}"
            f" + tail idle {t['tail_idle_cpu_s']:.0f}"
        )
    return line
