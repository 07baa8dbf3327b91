"""Stop what is left of a local Ray when the command that started it dies.

``ray.init()`` ties the head processes (GCS, raylet, monitors) to the starting process
with the kernel's parent-death signal, but the processes the raylet starts (dashboard
and runtime-env agents, workers, worker set-up) only notice the raylet's death by
polling, and then block on the dead GCS for about a minute, ignoring SIGTERM. So a
SIGKILLed command would leave them behind.

:func:`mmdtl2_dist.engine.driver.ensure_ray` runs this file as a separate process
(``python -I ray_watchdog.py DRIVER_PID RAY_DIR``, in a session of its own so that
signals aimed at the command's process group do not reach it; it imports nothing but
the standard library and psutil). It prints ``ready`` once it knows the driver's
existing descendants, and from then on tracks, every :data:`POLL_S` seconds, the
driver's new descendants that run from the Ray package directory ``RAY_DIR`` (the
processes ``ray.init()`` starts) and everything below them. Its standard input is a
pipe from the driver, on which the driver announces ``session <dir>``, the Ray
session directory.

End of input means the driver has exited (or let the session go): every tracked
process still alive (identified by pid and start time, so a reused pid is never hit),
and every orphan of the session (parent pid 1, Ray session directory in its command
line or among its open files), is killed with SIGKILL and the list is printed on
standard error. Once the session is announced and every tracked process has exited
while the driver lives (``ray.shutdown()``), the watchdog has nothing left to guard and
exits. It never
touches a process outside the driver's descendants but for such orphans of its own
session: neither another command's Ray nor a cluster started with ``ray start``.
"""

from __future__ import annotations

import os
import select
import signal
import sys

import psutil

POLL_S = 0.5


class _Session:
    """The Ray processes started by one driver, found by polling its descendants."""

    def __init__(self, driver: psutil.Process, ray_dir: str):
        self.driver = driver
        self.ray_dir = os.path.join(ray_dir, "")
        self.dir: str | None = None
        self.tracked: dict[int, psutil.Process] = {}
        self.before = {p.pid: p for p in self._descendants()}

    def _descendants(self) -> list[psutil.Process]:
        try:
            return self.driver.children(recursive=True)
        except psutil.Error:
            return []

    def _from_ray(self, proc: psutil.Process) -> bool:
        try:
            return any(self.ray_dir in arg for arg in proc.cmdline())
        except psutil.Error:
            return False

    def refresh(self) -> None:
        """Track new descendants that run Ray code, and every process below them."""
        new = [p for p in self._descendants() if not _same(self.before.get(p.pid), p)]
        found = True
        while found:  # parents first, whatever order the listing has
            found = False
            for p in new:
                if p.pid in self.tracked:
                    continue
                try:
                    below_tracked = p.ppid() in self.tracked
                except psutil.Error:
                    continue
                if below_tracked or self._from_ray(p):
                    self.tracked[p.pid] = p
                    found = True

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.tracked.values() if _running(p)]

    def orphans(self) -> list[psutil.Process]:
        """Processes of this session that were reparented before they were tracked."""
        if not self.dir:
            return []
        uid, found = os.getuid(), []
        for p in psutil.process_iter(["ppid", "uids", "cmdline"]):
            info = p.info
            if info["ppid"] != 1 or not info["uids"] or info["uids"].real != uid:
                continue
            try:
                used = list(info["cmdline"] or []) + [f.path for f in p.open_files()]
            except psutil.Error:
                continue
            if p.pid not in self.tracked and any(self.dir in u for u in used):
                found.append(p)
        return found


def _same(a: psutil.Process | None, b: psutil.Process) -> bool:
    return a is not None and a == b  # psutil compares pid and start time


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process, ray_dir: str) -> str:
    """Pid and what runs: the process title or the Ray program's path in the package."""
    try:
        words = p.cmdline() or [p.name()]
    except psutil.Error:
        words = ["?"]
    ray_words = [w.split(ray_dir, 1)[1] for w in words if ray_dir in w]
    return f"{p.pid} {(ray_words or [os.path.basename(words[0])])[0][:60]}"


def reap(session: _Session, driver_pid: int) -> list[str]:
    """Kill what is left of the session; return a description of each process killed."""
    victims = session.alive() + session.orphans()
    killed = []
    for p in victims:
        try:
            what = _describe(p, session.ray_dir)
            p.kill()
            killed.append(what)
        except psutil.Error:
            continue
    psutil.wait_procs(victims, timeout=5)
    if killed:
        where = f" {session.dir}" if session.dir else ""
        ended = "let it go" if _running(session.driver) else "has exited"
        print(
            f"mmdtl2: process {driver_pid}, which started the local Ray session{where}, "
            f"{ended}; stopped the {len(killed)} Ray process(es) left behind: " + ", ".join(killed),
            file=sys.stderr,
            flush=True,
        )
    return killed


def watch(driver_pid: int, ray_dir: str) -> None:
    """Guard the Ray session of ``driver_pid`` until it ends (see the module docstring)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        session = _Session(psutil.Process(driver_pid), ray_dir)
    except psutil.Error:
        return
    print("ready", flush=True)
    fd, pending = sys.stdin.fileno(), b""
    while True:
        readable, _, _ = select.select([fd], [], [], POLL_S)
        if readable:
            data = os.read(fd, 4096)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"session "):
                    session.dir = os.fsdecode(line[len(b"session ") :])
        session.refresh()
        if session.dir and session.tracked and not session.alive():
            return  # the session ended while the driver lives: nothing left to guard
    reap(session, driver_pid)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
