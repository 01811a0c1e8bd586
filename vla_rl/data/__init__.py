"""Training data for policies: expert demos, any LeRobotDataset on disk, chunked rows, mixing of sources.

- :func:`collect_demos` records a scripted expert into a LeRobotDataset (``vla-rl collect``);
- :func:`dataset_spec` reads what a dataset holds (policy-sizing fields) from its metadata;
- :func:`load_chunks` reads the features a policy needs (by name, shapes checked: :class:`DatasetError`)
  plus intervention / reward / success fields into a :class:`ChunkDataset` with seeded sampling;
- :class:`MixedSource` draws each batch's rows from several sources by weight.
"""

from vla_rl.data.chunks import ChunkBatch, ChunkDataset, make_chunks
from vla_rl.data.dataset import (
    DatasetError,
    DatasetSpec,
    PolicyInputs,
    check_inputs,
    dataset_spec,
    load_chunks,
    load_policy_chunks,
    policy_inputs,
)
from vla_rl.data.demos import collect_demos
from vla_rl.data.mix import ChunkSource, MixedSource, concat_batches, split_rows

__all__ = [
    "ChunkBatch", "ChunkDataset", "ChunkSource", "DatasetError", "DatasetSpec", "MixedSource", "PolicyInputs",
    "check_inputs", "collect_demos", "concat_batches", "dataset_spec", "load_chunks", "load_policy_chunks",
    "make_chunks", "policy_inputs", "split_rows",
]
