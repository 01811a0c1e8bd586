"""Torch thread counts per stage of the loop.

The env workers of a vector env and the policy take turns on the CPU: while the policy updates, the
workers wait. A stage during which nothing else runs may use more intra-op threads than the
rollout, where the workers need the cores (:class:`ThreadsConfig`, ``--threads.update``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class ThreadsConfig:
    """Torch intra-op threads per stage of a training iteration (-1: the process's setting, which the CLI
    takes from ``OMP_NUM_THREADS``, default 1; 0: every core this process may run on; N: N threads).

    Raise them only on a machine the run has to itself: with other jobs busy on the same cores, two
    threads made the quickstart's update several times slower, not faster (docs/results.md,
    "What does not work, and why")."""

    rollout: int = -1
    """While collecting: the policy acting (the env workers step in between, or alongside when pipelined)."""
    update: int = -1
    """During the learner's update, while the env workers wait."""


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(threads: int) -> int:
    """``threads``, with 0 meaning every usable core; never below 1."""
    return max(1, threads or usable_cores())


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``resolve_threads(threads)`` torch intra-op threads, then restore the count.

    ``threads`` < 0 leaves the count alone.
    """
    if threads < 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(resolve_threads(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
