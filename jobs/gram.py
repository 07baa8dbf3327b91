"""Ray job: compute the Gram of a feature space on the cluster the job runs on.

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . -- \
        python jobs/gram.py /mnt/shared/mmdtl2/study.zarr --space conv3 --address auto

Arguments are those of ``mmdtl2 gram``; ``--address auto`` makes it use the job's
cluster (without it, ``mmdtl2 gram`` starts a Ray of its own inside the job). The Gram
goes to ``/mnt/shared/mmdtl2/study.zarr.grams/``, where studies on the store reuse it.
"""

import sys

from mmdtl2_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["gram", *sys.argv[1:]]))
