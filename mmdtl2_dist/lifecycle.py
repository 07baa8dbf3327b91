"""A child process that outlives the process that started it stops by itself.

A parent killed outright (SIGKILL, the out-of-memory killer) cannot stop its children:
the local study executor's workers would wait for work forever, and ``mmdtl2 serve``'s
workers would go on answering on its port with the model it served. Each such child
watches its parent with :func:`when_parent_is_gone`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

#: Seconds between a child's checks that its parent still runs.
CHECK_S = 1.0


def process_runs(pid: int) -> bool:
    """Whether process ``pid`` of this host may still run: True unless provably gone.

    A zombie not yet reaped counts as running; so does another user's process, and a
    ``pid`` that names no single process (``≤ 0``, or too large).
    """
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def when_parent_is_gone(parent: int, then: Callable[[], None], name: str) -> None:
    """Call ``then()`` in a daemon thread once ``parent`` is no longer this process's parent.

    That is, once it died and this process was re-parented.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(CHECK_S)
        then()

    threading.Thread(target=watch, name=name, daemon=True).start()
