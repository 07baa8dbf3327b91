"""The ASGI app that ``mmdtl2 serve`` hands to uvicorn's worker processes.

Importing this module loads the model named by the environment (see
:func:`mmdtl2_dist.deploy.serve.app_from_env`): uvicorn imports an app by name in every
worker it starts.
"""

from mmdtl2_dist.deploy.serve import app_from_env

app = app_from_env()
