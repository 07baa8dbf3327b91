"""Ray job: run, resume or report a study on the cluster the job runs on.

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . -- \
        python jobs/study.py run /mnt/shared/mmdtl2/study.toml --address auto \
        --tracking-uri http://MLFLOW_HOST:5000

Arguments are those of ``mmdtl2 study``; ``run`` and ``resume`` need ``--address auto``
to use the job's cluster (without it they start a Ray of their own inside the job).
"""

import sys

from mmdtl2_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["study", *sys.argv[1:]]))
