"""The ``gaussian-mlp`` policy's tiny variant for ``--smoke true`` runs (see :mod:`policies.smoke`)."""

from __future__ import annotations

from policies.mlp.policy import NAME
from policies.smoke import MAX_CHUNK, SMOKE_VARIANTS, SmokeVariant

SMOKE_VARIANTS.register(NAME)(SmokeVariant(obs_mode="state", caps={"chunk_size": MAX_CHUNK}, sets={"hidden": (16, 16)}))
