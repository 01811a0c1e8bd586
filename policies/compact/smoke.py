"""The ``compact-flow`` policy's tiny variant for ``--smoke true`` runs (see :mod:`policies.smoke`)."""

from __future__ import annotations

from policies.compact.policy import NAME
from policies.smoke import MAX_CHUNK, SMOKE_VARIANTS, SmokeVariant

SMOKE_VARIANTS.register(NAME)(SmokeVariant(
    obs_mode="state",
    caps={"chunk_size": MAX_CHUNK},
    sets={"width": 32, "heads": 2, "prefix_layers": 1, "expert_layers": 1, "cnn_channels": (8, 16),
          "image_tokens": 2, "text_encoder": "hashed", "text_buckets": 256, "value_hidden": 32, "noise_hidden": 16},
))
