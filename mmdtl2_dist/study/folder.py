"""What a study folder is, and the one run at a time that writes it.

A study folder (``--output``) is recognised by its state file, or, before a run wrote
that, by holding only what a run writes first: the study's lock file and a ``data``
folder of the data a study builds (:func:`holds_only_built_data`). Anything else there
is the user's, and the folder is refused (:func:`~mmdtl2_dist.store.outputs.claim_output`).

A run holds the folder's lock (:mod:`mmdtl2_dist.store.locks`) from before it reads the
state file until it ends: a second run of the study, ``resume`` or ``office --out``
included, is refused while the first writes there, since the two would interleave their
data, plan and results.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmdtl2_dist.store.locks import locked_folder, refuse_if_held
from mmdtl2_dist.store.outputs import PROBE_PREFIX, OutputKind, OutputPathError, claim_output
from mmdtl2_dist.study.plan import STATE_FILE
from mmdtl2_dist.study.spec import StudySpec

#: What a study builds in ``<output>/data`` (bundled and synthetic data).
BUILT_DATA = ("office_caltech10.zarr", "hoffman_splits.json", "synthetic.zarr")
#: The lock a running study holds in its folder (:mod:`mmdtl2_dist.store.locks`).
STUDY_LOCK = ".study.lock"


def holds_only_built_data(output: Path) -> bool:
    """Whether ``output`` holds only what a study writes before its state file.

    The study's lock file, and a ``data`` folder of what a study builds (its writes in
    flight included: hidden siblings ``.<name>.tmp-…``, and the folder's writability
    probe): what a run stopped while it built its data leaves. Never through a link.
    """
    if not output.is_dir() or output.is_symlink():
        return False
    entries = {e.name: e for e in output.iterdir() if not _is_probe(e)}
    lock, data = entries.pop(STUDY_LOCK, None), entries.pop("data", None)
    if entries or (lock is None and data is None):
        return False
    if lock is not None and (lock.is_symlink() or not lock.is_file()):
        return False
    if data is None:
        return True
    if data.is_symlink() or not data.is_dir():
        return False
    return all(
        e.name in BUILT_DATA or _is_write_in_flight(e.name) or _is_probe(e) for e in data.iterdir()
    )


def _is_probe(entry: Path) -> bool:
    """The file :func:`~mmdtl2_dist.store.outputs.make_output_folder` tests a folder with."""
    name = re.escape(PROBE_PREFIX) + r"[A-Za-z0-9_]{8}"
    return bool(re.fullmatch(name, entry.name)) and entry.is_file() and not entry.is_symlink()


def _is_write_in_flight(name: str) -> bool:
    """A temporary of an atomic write or a staged store of :data:`BUILT_DATA`."""
    from mmdtl2_dist.store.atomic import TEMPORARY_NAME

    staged = re.fullmatch(r"\.(?P<name>.+)\.(tmp|old)-.+-\d+-[0-9a-f]{8}", name)
    m = TEMPORARY_NAME.fullmatch(name) or staged
    return m is not None and m["name"] in BUILT_DATA


#: A study folder: its state file, or only what a run writes before it.
STUDY_OUTPUT = OutputKind(
    "study folder",
    is_dir=True,
    recognise=lambda path: (path / STATE_FILE).is_file() or holds_only_built_data(path),
)


@contextmanager
def study_folder_lock(spec: StudySpec) -> Iterator[None]:
    """Claim ``spec.output`` for this study and hold its lock while inside.

    Refused (:class:`~mmdtl2_dist.store.outputs.OutputPathError`) when the folder is not
    this system's, and (:class:`~mmdtl2_dist.store.locks.OutputBusy`) while another run
    holds it; a folder found in the state a first run passes through on its way to the
    lock is busy, not foreign.
    """
    busy = (
        f"{_writing(spec.output)}; wait for it to finish, or stop it (Ctrl-C) and run this "
        "command again to resume."
    )
    try:
        claim_output(spec.output, STUDY_OUTPUT, overwrite=None)  # ours to continue, or free
    except OutputPathError:
        refuse_if_held(spec.output / STUDY_LOCK, busy)
        raise
    with locked_folder(spec.output, STUDY_LOCK, "one study", busy):
        yield


def _writing(output: Path) -> str:
    """Who holds a study folder, for the messages of those it refuses."""
    return f"another run of this study is writing {output} (it holds {output / STUDY_LOCK})"


def refuse_if_running(output: Path) -> None:
    """Refuse (:class:`~mmdtl2_dist.store.locks.OutputBusy`) a folder another run writes."""
    refuse_if_held(
        Path(output) / STUDY_LOCK,
        f"{_writing(output)}; wait for it to finish, or stop it (Ctrl-C) first.",
    )
