"""Distributed Gram engine on Ray: out-of-core, resumable, deterministic Gram matrices."""

from mmdtl2_dist.engine.driver import compute_gram
from mmdtl2_dist.engine.gram_store import GramStore
from mmdtl2_dist.engine.in_process import IN_PROCESS
from mmdtl2_dist.engine.location import default_gram_dir, gram_key, gram_location
from mmdtl2_dist.engine.plan import Tile, feature_blocks, gram_tile_plan, row_segments
from mmdtl2_dist.engine.ray_session import ensure_ray

__all__ = [
    "IN_PROCESS",
    "GramStore",
    "Tile",
    "compute_gram",
    "default_gram_dir",
    "ensure_ray",
    "feature_blocks",
    "gram_key",
    "gram_location",
    "gram_tile_plan",
    "row_segments",
]
