"""Feature store: Zarr feature arrays and Parquet metadata (see :mod:`.layout`)."""

from mmdtl2_dist.store.feature_store import (
    CorruptChunkError,
    FeatureStore,
    StoreWriter,
    read_array_block,
)
from mmdtl2_dist.store.ingest import IngestError, IngestInput, ingest
from mmdtl2_dist.store.synthetic import SyntheticSpec, make_synthetic_store

__all__ = [
    "CorruptChunkError",
    "FeatureStore",
    "IngestError",
    "IngestInput",
    "StoreWriter",
    "SyntheticSpec",
    "ingest",
    "make_synthetic_store",
    "read_array_block",
]
