"""Ray job: convert feature files into a feature store on shared storage.

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . -- \
        python jobs/ingest.py /mnt/shared/mmdtl2/study.zarr -i DEVICE:SPACE:/mnt/shared/in.mat

Arguments are those of ``mmdtl2 ingest`` (see ``mmdtl2 ingest --help``).
"""

import sys

from mmdtl2_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["ingest", *sys.argv[1:]]))
