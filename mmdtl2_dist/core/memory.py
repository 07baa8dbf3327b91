"""The memory a process can still have.

Solvers that trade memory for time ask it before they choose a route: the W-step
refuses a Hessian that would not fit (:func:`~mmdtl2_dist.core.wstep.check_wstep_fits`),
coordinate descent a polish of the unbuilt W-step Hessian whose free block would not
(:func:`~mmdtl2_dist.core.dcd.check_free_block_fits`), and the linear SVM takes its
primal where the dual's ``n × n`` arrays would not (:func:`~mmdtl2_dist.core.svm.linear_svm`).
"""

from __future__ import annotations

from pathlib import Path


def available_bytes() -> int:
    """Memory this process can still have, in bytes.

    The system's available memory (psutil), or less when a cgroup v2 limit (a container,
    a Ray worker's limit) caps it.
    """
    import psutil

    have = int(psutil.virtual_memory().available)
    try:
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return have
    return have if cap == "max" else min(have, int(cap) - used)
