"""Images to features (``mmdtl2 extract``) and seeded synthetic images.

A torchvision CNN cut at named layers runs on Ray over shards of images and its outputs
are written to a feature store.

- :mod:`~mmdtl2_dist.extract.inputs`: the image table (folder layout or manifest);
- :mod:`~mmdtl2_dist.extract.model`: model, layers, weights, preprocessing, decoding
  (torch, torchvision and Pillow only; shipped with image-input adapters);
- :mod:`~mmdtl2_dist.extract.shards`: one shard's work and the Ray actor that does it;
- :mod:`~mmdtl2_dist.extract.job`: the resumable job and the store it writes.

torch and torchvision are the optional extra ``images`` (``pip install -e '.[images]'``);
nothing here imports them until a model is loaded.
"""
