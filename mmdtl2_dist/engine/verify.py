"""Checking what earlier runs of a Gram job stored, and finishing a job's store."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from mmdtl2_dist.engine import tasks
from mmdtl2_dist.engine.gram_store import JOB_FILE, TILES_DIR, GramStore
from mmdtl2_dist.store.atomic import write_json_atomic
from mmdtl2_dist.store.chunk_files import remove_stray_writes


def forget_damaged(out: Path, job: dict, tiles, progress: bool) -> list[str]:
    """Check what earlier runs stored and forget its damaged parts, so this run redoes them.

    Every finished tile's chunk is decoded (which checks its CRC32C) and checked against
    the checksum its task recorded in the marker: a chunk that fails, is missing, or holds
    other values loses its marker and is recomputed, and so is a tile whose marker cannot
    be read (or, in a finished Gram, is missing). Damaged statistics are recomputed
    too (same bits: their sums have a fixed order) and a damaged diagonal is rewritten.
    Chunk writes that a stop cut short before their rename are removed.

    Returns
    -------
    list of str
        What was damaged (also printed to stderr); empty if everything is intact.
    """
    remove_stray_writes(str(out / "gram"))
    gram = zarr.open_array(str(out / "gram"), mode="r")
    markers = GramStore.open(out).finished_tiles()
    if progress and markers:
        print(f"gram {job['space']}: verifying {len(markers)} finished tiles", file=sys.stderr)
    found = []
    for tile in tiles:
        marker = out / TILES_DIR / f"{tile.key}.json"
        if tile.key in markers:
            why = _tile_damage(gram, tile, markers[tile.key])
        elif marker.exists():  # a split tile's combine would find it and stop there
            why = "has an unreadable marker"
        else:
            why = job.get("complete") and "has no marker"
        if why:
            marker.unlink(missing_ok=True)
            chunk_file = out / "gram" / "c" / str(tile.i) / str(tile.j)
            found.append(f"tile {tile.key} (chunk file {chunk_file}) {why}")
    bad_stats = [
        f"{name} {why}"
        for name in _stats_arrays(job)
        if job["stats_done"] and (why := _array_damage(out / name))
    ]
    if bad_stats:
        job["stats_done"] = False
    sq_why = job.get("complete") and _array_damage(out / "sq_norms")
    damaged = found + bad_stats + ([f"sq_norms {sq_why}"] if sq_why else [])
    if damaged:
        job["complete"] = False
        write_json_atomic(out / JOB_FILE, job)
    report_damage(job, out, damaged)
    return damaged


def report_damage(job: dict, out: Path, damaged: list[str]) -> None:
    """Name on stderr the damaged parts of ``out`` that this run recomputes (if any)."""
    if damaged:
        print(
            f"gram {job['space']}: {out} has damaged parts, recomputed in this run: "
            + "; ".join(damaged),
            file=sys.stderr,
            flush=True,
        )


def _tile_damage(gram: zarr.Array, tile, marker: dict) -> str | None:
    """Why a finished tile's stored chunk is not what its task wrote (None if it is)."""
    try:
        block = gram[tile.a0 : tile.a1, tile.b0 : tile.b1]
    except Exception as exc:  # noqa: BLE001 - any decode failure (checksum, truncation)
        return f"cannot be decoded ({type(exc).__name__}: {exc})"
    if tasks.tile_matches(block, marker):
        return None
    if np.isnan(block).all():
        return "is missing"
    return "holds other values than its task wrote (checksum recorded in its marker)"


def _stats_arrays(job: dict) -> list[str]:
    """The statistics arrays a Gram store holds for its preprocessing."""
    method = job["preprocessing"]
    names = ["row_norms"] if method in tasks.L2_METHODS else []
    if method in tasks.ZSCORE_METHODS:
        names += [f"stats/{dev}/{part}" for dev in job["devices"] for part in ("mean", "scale")]
    return names


def _array_damage(path: Path) -> str | None:
    """Why a small stored array cannot be used (None if it reads back whole)."""
    try:
        values = zarr.open_array(str(path), mode="r")[:]
    except Exception as exc:  # noqa: BLE001 - missing metadata or a failed decode
        return f"cannot be read ({type(exc).__name__}: {exc})"
    if values.size and np.isnan(values).all():
        return "is missing"
    return None


def finish(out: Path, job: dict, tiles) -> None:
    """Check every tile is marked done and store the Gram diagonal (squared norms)."""
    markers = {p.stem for p in (out / TILES_DIR).glob("*.json")}
    missing = [t.key for t in tiles if t.key not in markers]
    if missing:
        raise RuntimeError(f"Gram job finished with tiles not done: {missing[:10]}.")
    gram = zarr.open_array(str(out / "gram"), mode="r")
    sq = np.empty(job["n_rows"])
    for t in tiles:
        if t.diagonal:
            sq[t.a0 : t.a1] = np.diag(gram[t.a0 : t.a1, t.a0 : t.a1])
    root = zarr.open_group(str(out), mode="r+")
    root.create_array(
        "sq_norms", data=sq, chunks=(max(1, sq.size),), compressors=[Crc32cCodec()], overwrite=True
    )
