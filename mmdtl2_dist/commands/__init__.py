"""Sub-commands of the ``mmdtl2`` command line (one module each)."""
