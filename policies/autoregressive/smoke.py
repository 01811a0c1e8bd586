"""The ``openvla-style`` policy's tiny variant for ``--smoke true`` runs (see :mod:`policies.smoke`):
the offline ``tiny-llava`` backbone, one action per decision."""

from __future__ import annotations

from policies.autoregressive.policy import POLICY_TYPE
from policies.smoke import SMOKE_VARIANTS, SmokeVariant

SMOKE_VARIANTS.register(POLICY_TYPE)(SmokeVariant(
    caps={"chunk_size": 1},
    sets={"backbone": "tiny-llava", "trust_remote_code": False, "dtype": "float32", "value_hidden_dim": 32,
          "unnorm_key": None},
))
