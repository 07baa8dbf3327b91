"""Where a Gram lives, and how two processes that need the same one share it.

A Gram's values depend only on the feature store's content, the feature space, the
preprocessing and the precision of its products: its rows are every device of the space
in sorted order, so the store's content fixes the device set too. Grams are therefore
kept in a *Gram folder*, one subfolder per key
``<space>__<preprocessing>__<fingerprint[:16]>`` (a mixed-precision Gram:
``<space>__<preprocessing>-mixed__<fingerprint[:16]>``, never taken for the exact one;
:func:`gram_key`; the fingerprint is :attr:`FeatureStore.fingerprint
<mmdtl2_dist.store.feature_store.FeatureStore.fingerprint>`), and everything that needs a
Gram (``mmdtl2 gram``, a study) looks there first: a complete Gram of that key is used as
it is, a partial one is resumed, and a store whose content changed gets another key.

The default Gram folder is ``<store>.grams`` beside the store (:func:`default_gram_dir`):
a store on a cluster's shared storage has its Grams on shared storage too. Nothing in a
Gram is looked up by an absolute path, so moving the store together with its ``.grams``
folder, or pointing ``gram_dir`` at a moved Gram folder, keeps the Grams in use.

Two processes that compute the same Gram at once are kept apart by an advisory lock
(:func:`gram_lock`, ``fcntl.flock`` on ``.<key>.lock`` beside the Gram): the second
waits, says so on stderr, then finds the Gram complete and uses it. A process that dies
releases its lock with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmdtl2_dist.progress import say
from mmdtl2_dist.store.feature_store import FeatureStore
from mmdtl2_dist.store.locks import held_lock
from mmdtl2_dist.store.outputs import NO_ROOM, OutputPathError

GRAM_DIR_SUFFIX = ".grams"


def gram_key(
    store_fingerprint: str, space: str, preprocessing: str, precision: str = "float64"
) -> str:
    """The folder name of a Gram inside a Gram folder (the exact Gram's has no suffix)."""
    how = preprocessing if precision == "float64" else f"{preprocessing}-{precision}"
    return f"{space}__{how}__{store_fingerprint[:16]}"


def default_gram_dir(store_path: str | os.PathLike) -> Path:
    """The Gram folder of a store when none is given: ``<store>.grams`` beside it."""
    store = Path(store_path).expanduser().absolute()
    return store.with_name(store.name + GRAM_DIR_SUFFIX)


def gram_location(
    fs: FeatureStore,
    space: str,
    preprocessing: str,
    gram_dir: str | os.PathLike | None = None,
    precision: str = "float64",
) -> Path:
    """The folder of the Gram of ``fs``'s content in ``space``, ``preprocessing``, ``precision``.

    ``gram_dir`` is the Gram folder (default :func:`default_gram_dir` of the store); the
    Gram's folder inside it is named by :func:`gram_key`.
    """
    folder = default_gram_dir(fs.path) if gram_dir is None else Path(gram_dir).expanduser()
    return folder.absolute() / gram_key(fs.fingerprint, space, preprocessing, precision)


def make_gram_dir(folder: Path) -> None:
    """Create a Gram folder (and its parents), or say how to choose another one."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in NO_ROOM:
            raise
        raise OutputPathError(
            f"cannot create the Gram folder {folder} ({exc.strerror}); choose a writable "
            'one with `mmdtl2 gram --gram-dir DIR` or `gram_dir = "DIR"` in a study '
            "spec's [data] (by default Grams are kept beside the store, in "
            f"<store>{GRAM_DIR_SUFFIX}).",
        ) from exc


@contextmanager
def gram_lock(out: Path, progress: bool | None = None) -> Iterator[None]:
    """Hold the advisory lock of the Gram at ``out``, waiting while another process has it.

    ``progress`` (:func:`mmdtl2_dist.progress.say`) governs the lines about waiting. The
    lock file is ``.<name>.lock`` beside ``out`` (:mod:`mmdtl2_dist.store.locks`).
    """
    path = out.with_name(f".{out.name}.lock")

    def waiting(seconds: float | None) -> None:
        if seconds is None:
            say(progress, f"gram: another process is computing {out} (it holds {path}); waiting")
        else:
            say(progress, f"gram: the other process let go of {out} after {seconds:.0f} s")

    fix = (
        "computing a Gram needs a writable folder for it: choose another one (`mmdtl2 gram "
        '--gram-dir DIR` or `--out DIR`, or `gram_dir = "DIR"` in a study spec\'s [data]).'
    )
    # 0o666 (less the umask): a Gram folder may be shared by a group's users
    with held_lock(path, f"the Gram {out.name}", fix=fix, mode=0o666, waiting=waiting):
        yield
