"""Data sets bundled with mmdtl2-dist (with their SOURCE notes)."""
