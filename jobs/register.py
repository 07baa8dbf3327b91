"""Ray job: register a study's chosen adapter in the MLflow model registry.

    mmdtl2 submit --address http://HEAD_IP:8265 --working-dir . \
        --env MLFLOW_TRACKING_URI=http://MLFLOW_HOST:5000 -- python jobs/register.py ...

Arguments are those of ``mmdtl2 register``.
"""

import sys

from mmdtl2_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["register", *sys.argv[1:]]))
