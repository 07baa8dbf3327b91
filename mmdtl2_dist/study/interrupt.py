"""Stopping a study on SIGINT or SIGTERM: finished trials are kept, ``resume`` goes on.

:func:`stop_on_signals` routes both signals to the running executor (it stops at its next
step) and raises :class:`StudyInterrupted`, whose exit code and message say how to resume.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

from mmdtl2_dist.study.executors import STOP, missing_trials
from mmdtl2_dist.study.plan import STATE_FILE
from mmdtl2_dist.study.spec import StudySpec

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


class StudyInterrupted(KeyboardInterrupt):
    """A study stopped by SIGINT or SIGTERM; its finished trials are kept for a resume.

    ``exit_code`` is the shell's ``128 + signal number``: 130 for SIGINT (Ctrl-C), 143 for
    SIGTERM.
    """

    def __init__(self, signum: int, spec: StudySpec):
        trials = spec.trials()
        self.signum = int(signum)
        self.output = spec.output
        self.total = len(trials)
        self.done = self.total - len(missing_trials(spec.output, trials))
        kept = f" (kept in {self.output / 'results'})" if self.done else ""
        super().__init__(
            f"stopped by {signal.Signals(self.signum).name} with {self.done} of "
            f"{self.total} trials done{kept}"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def resumable(self) -> bool:
        """Whether ``study resume`` can continue it (the stop came after the data check)."""
        return (self.output / STATE_FILE).exists()


def reclaim_signals() -> None:
    """Put the study's signal handlers back after an executor started.

    Ray's core worker installs its own SIGTERM handler in the driver, which logs and
    aborts, so a SIGTERM would leave neither a resume hint nor an exit status of 143.
    """
    if STOP["handler"] is not None:
        for s in _STOP_SIGNALS:
            signal.signal(s, STOP["handler"])


@contextmanager
def stop_on_signals(spec: StudySpec):
    """While a study runs, SIGINT and SIGTERM stop it cleanly and raise StudyInterrupted.

    The first signal is recorded (``executors.STOP``). While an executor runs trials, it
    then stops at its next step (Tune ends the experiment; the local executor stops its
    workers), so the driver is never stopped halfway through writing a result file or an
    MLflow run (running trials are dropped and run again on resume); anywhere else it
    raises ``KeyboardInterrupt`` at once (the Gram resumes from its finished tiles). A
    second signal always raises at once. Tune's own SIGINT handler, which stops quietly
    and returns as if the run had finished, is turned off so that one handler sees every
    signal. Outside the main thread no handler can be installed and signals keep their
    default effect.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    STOP.update(signum=None, in_trials=False)

    def on_signal(signum, frame):
        first = STOP["signum"] is None
        if first:
            STOP["signum"] = signum
        if not (first and STOP["in_trials"]):
            raise KeyboardInterrupt

    STOP["handler"] = on_signal
    saved = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    env = os.environ.get(_TUNE_SIGINT_ENV)
    os.environ[_TUNE_SIGINT_ENV] = "1"
    try:
        yield
    except KeyboardInterrupt:
        raise StudyInterrupted(STOP["signum"] or signal.SIGINT, spec) from None
    finally:
        STOP["handler"] = None
        for s, handler in saved.items():
            signal.signal(s, handler)
        if env is None:
            os.environ.pop(_TUNE_SIGINT_ENV, None)
        else:
            os.environ[_TUNE_SIGINT_ENV] = env
