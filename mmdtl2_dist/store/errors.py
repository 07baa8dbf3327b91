"""The error of a damaged store, shared by its readers."""

from __future__ import annotations


class CorruptChunkError(ValueError):
    """A chunk of a Zarr array failed its checksum, could not be decoded or is missing.

    Attributes
    ----------
    array_path : str
        Absolute path of the Zarr array.
    chunks : list of tuple of int
        Grid coordinates of the bad chunks.
    """

    def __init__(self, array_path: str, chunks: list[tuple[int, ...]], reason: str):
        self.array_path = array_path
        self.chunks = chunks
        listed = ", ".join(str(c) for c in chunks[:10])
        more = f" and {len(chunks) - 10} more" if len(chunks) > 10 else ""
        super().__init__(
            f"corrupt data in {array_path}: chunk(s) {listed}{more} {reason}. The store is "
            "damaged; re-run `mmdtl2 ingest` (or restore it from a copy). "
            "`FeatureStore.open(path).verify()` lists every bad chunk."
        )

    def __reduce__(self):
        # Keep the attributes when the error crosses a Ray process boundary.
        return (_rebuild_corrupt, (self.array_path, self.chunks, str(self)))


def _rebuild_corrupt(array_path, chunks, message):
    err = CorruptChunkError.__new__(CorruptChunkError)
    ValueError.__init__(err, message)
    err.array_path, err.chunks = array_path, chunks
    return err
