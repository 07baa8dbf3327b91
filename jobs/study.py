"""Ray job: run, resume or report a study on the cluster the job runs on.

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . \
        --env MLFLOW_TRACKING_URI=http://MLFLOW_HOST:5000 -- \
        python jobs/study.py run /mnt/shared/mmdtl2/studies/paper.toml

Arguments are those of ``mmdtl2 study`` (``run``, ``resume``, ``report``).
"""

import sys

from mmdtl2_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["study", *sys.argv[1:]]))
