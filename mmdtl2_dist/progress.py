"""Progress lines for long-running work: done/total, elapsed time and ETA, on stderr.

One reporter for every step that takes more than a few seconds (the Gram engine, ingest,
study trials, ``mmdtl2 office``, ``mmdtl2 register``). Progress is for a person watching
a terminal: lines go to stderr, and by default only when stderr *is* a terminal, so that
``mmdtl2 office | cat`` or ``mmdtl2 office > table.md`` get the results and nothing
else. ``enabled=True`` / ``False`` (the commands' ``--progress`` / ``--no-progress``)
overrides the choice, and so does the environment variable ``MMDTL2_PROGRESS`` (``1`` or
``0``) where no option is given: a Ray job's logs, which ``mmdtl2 submit`` streams to a
person, are no terminal (``cluster/runtime_env.yaml`` sets it to ``1``).

This module uses the standard library only and imports nothing from the package, so every
layer (store, engine, study, deploy) can use it; the numerical core stays free of I/O.

A line looks like::

    gram conv3: 40/120 tiles (33 %), 12 s elapsed, ETA 24 s; 3.1 GFLOP/s

Lines are throttled (:meth:`Progress.due`): one when the work advanced and ``every_s``
seconds have passed, one at each ``step`` fraction of the total (but not more often than
``min_gap_s``), one when the work is complete, and a heartbeat every ``heartbeat_s``
seconds while nothing finishes. The ETA assumes the remaining units take as long as the
ones done so far in this run (units done before it started, e.g. resumed tiles, count as
done but not towards the rate).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

#: Environment variable that turns progress on (``1``) or off (``0``) where no option does.
ENV_VAR = "MMDTL2_PROGRESS"


def progress_enabled(choice: bool | None, stream: TextIO | None = None) -> bool:
    """Resolve a progress choice.

    ``True``/``False`` stand; ``None`` follows ``MMDTL2_PROGRESS`` when it is set, else
    whether ``stream`` (default stderr) is a terminal.
    """
    if choice is not None:
        return bool(choice)
    env = os.environ.get(ENV_VAR, "").strip()
    if env in ("0", "1"):
        return env == "1"
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Throttled progress lines of one piece of work (see the module docstring).

    Parameters
    ----------
    label : str
        What is being done (the line's prefix), e.g. ``"gram conv3"``.
    total : int or None
        Units of work; ``None`` when unknown (lines then show the elapsed time only).
    unit : str
        Name of a unit (``"tiles"``, ``"fits"``).
    enabled : bool or None
        Print at all; ``None``: when ``stream`` is a terminal (:func:`progress_enabled`).
    done : int
        Units already done when the work starts (counted as done, not in the rate).
    every_s, step, min_gap_s, heartbeat_s : float
        Throttling (module docstring).
    clock : callable
        Seconds, monotonic (tests pass a fake clock).
    stream : file, optional
        Where lines go (default: ``sys.stderr`` at the time of writing).
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        enabled: bool | None = None,
        done: int = 0,
        every_s: float = 10.0,
        step: float = 0.1,
        min_gap_s: float = 1.0,
        heartbeat_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
    ):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream
        self.enabled = progress_enabled(enabled, self._out())
        self.every_s, self.step = every_s, step
        self.min_gap_s, self.heartbeat_s = min_gap_s, heartbeat_s
        self.clock = clock
        self.t0 = self.last_t = clock()
        self.start = self.done = self.last_done = int(done)
        self._lock = threading.Lock()

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    # -- arithmetic ---------------------------------------------------------------------
    def elapsed(self, now: float | None = None) -> float:
        return (self.clock() if now is None else now) - self.t0

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at this run's rate; ``None`` before the first unit or without a total."""
        ran = self.done - self.start
        if self.total is None or ran <= 0:
            return None
        return self.elapsed(now) / ran * max(self.total - self.done, 0)

    def _bucket(self, done: int) -> int:
        if not self.total or self.step <= 0:
            return 0
        return math.floor(done / self.total / self.step + 1e-9)

    def due(self, now: float) -> bool:
        """Whether a line is due at ``now`` (the throttling rules of the module docstring)."""
        since = now - self.last_t
        advanced = self.done > self.last_done
        if self.total is not None and self.done >= self.total and advanced:
            return True
        if advanced and since >= self.every_s:
            return True
        if (
            advanced
            and since >= self.min_gap_s
            and self._bucket(self.done) > self._bucket(self.last_done)
        ):
            return True
        return since >= self.heartbeat_s

    def line(self, detail: str = "", now: float | None = None) -> str:
        """The progress line for the current state."""
        now = self.clock() if now is None else now
        parts = [f"{self.label}:"]
        if self.total is not None:
            pct = 100 * self.done / self.total if self.total else 100.0
            unit = f" {self.unit}" if self.unit else ""
            parts.append(f"{self.done}/{self.total}{unit} ({pct:.0f} %),")
        parts.append(f"{format_duration(self.elapsed(now))} elapsed")
        text = " ".join(parts)
        eta = self.eta(now)
        if eta is not None and self.done < self.total:
            text += f", ETA {format_duration(eta)}"
        return f"{text}; {detail}" if detail else text

    # -- reporting ------------------------------------------------------------------------
    def update(self, done: int, detail: str = "", *, force: bool = False) -> bool:
        """Set the units done; print a line if one is due (or ``force``). Returns whether it did."""
        with self._lock:
            self.done = int(done)
            now = self.clock()
            if not self.enabled or not (force or self.due(now)):
                return False
            self.last_t, self.last_done = now, self.done
            self._write(self.line(detail, now))
            return True

    def say(self, message: str) -> None:
        """A one-off line (a stage starting, a result), when progress is enabled."""
        if self.enabled:
            with self._lock:
                self._write(message)

    def _write(self, text: str) -> None:
        out = self._out()
        out.write(text + "\n")
        out.flush()

    @contextmanager
    def ticking(self, detail: str = "", period_s: float | None = None) -> Iterator[Progress]:
        """Heartbeat lines (elapsed, ETA if known) every ``period_s`` while a blocking call runs.

        For one long call that reports nothing itself (a single fit); ``period_s``
        defaults to ``every_s``.
        """
        if not self.enabled:
            yield self
            return
        stop = threading.Event()
        period = self.every_s if period_s is None else period_s

        def beat():
            while not stop.wait(period):
                self.update(self.done, detail, force=True)

        thread = threading.Thread(target=beat, name=f"progress {self.label}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


def say(enabled: bool | None, message: str) -> None:
    """Print one progress message to stderr under the same rule as :class:`Progress`."""
    Progress("", enabled=enabled).say(message)
