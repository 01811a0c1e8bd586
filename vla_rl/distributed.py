"""Several processes, one loop: everything the trainer and the learners need to run under ``accelerate`` / ``torchrun``.

``torchrun --nproc_per_node N -m vla_rl train ...``, ``accelerate launch --multi_gpu --num_processes N -m vla_rl
train ...`` or, on CPUs through MPI, ``accelerate launch --cpu --num_processes N --mpirun_hostfile
configs/accelerate/localhost.hostfile -m vla_rl train ...`` starts N copies of the same loop (ranks).
:meth:`Distributed.from_environment` reads the launcher's variables (torchrun's or MPI's) and builds an
:class:`accelerate.Accelerator` (gloo on CPUs, NCCL on GPUs); a run started without a launcher gets :data:`SINGLE`,
whose every method is the identity, so single-process runs execute exactly the code they executed before this module
existed. What each rank does, and what keeps its meaning across ranks:

- **envs**: ``env.num_envs`` is the total over all ranks; rank ``r`` steps the ``num_envs / N`` envs
  ``[r * n, (r + 1) * n)`` of the run and seeds them as those envs (:meth:`Distributed.env_shard`); iteration
  ``k``'s seed base is shifted by ``r * n`` (:meth:`Distributed.seed_base`), so every rank plays distinct,
  reproducible episodes inside the run's seed range. The policy's sampling noise comes from a per-rank torch
  seed (:func:`rank_seed`).
- **advantages** are computed on each rank's own envs (GAE and GRPO's group statistics are per env / per group,
  and a GRPO group never spans two ranks: ``group_size`` must divide ``num_envs / N``); **advantage
  normalization** uses the mean and std over all ranks' valid decisions (:meth:`Distributed.normalize_advantages`),
  as one process normalizes over its whole rollout.
- **minibatch size** (``algo.minibatch_size``, SFT's ``batch_size``) is the global number of samples per gradient
  step: each rank takes ``1 / N`` of it and DDP averages the gradients, so with equal shards a step is the step one
  process takes on the union (tested to float tolerance, ``tests/vla_rl/test_distributed.py``). Every rank runs the
  same number of steps (:meth:`Distributed.minibatches`).
- **gradients** are all-reduced by DDP (``accelerator.prepare``): the learners call the policy through
  :class:`PolicyCall`, a module whose ``forward`` runs a named policy method (``evaluate``, ``sft_loss``), so DDP's
  reducer sees every forward and backward; FSDP (for pi0 / pi0.5) comes from accelerate's config in the same call.
- **metrics**: episode records are gathered and summarized over all ranks, update statistics averaged, env steps
  summed (:meth:`Distributed.merge_scalars`); **evaluation** splits the evaluation envs the same way and gathers
  the episodes, so the score is that of the same held-out episodes one process would play.
- **rank 0** logs and writes checkpoints; every rank's RNG state and per-rank learner state
  (:meth:`vla_rl.algorithms.base.Learner.rank_state`) go into the checkpoint, and resume restores each rank's own.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vla_rl.config import ConfigError

_WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def launched_world_size() -> int:
    """Processes the launcher started (``WORLD_SIZE`` of torchrun / accelerate, or MPI's); 1 without a launcher."""
    for var in _WORLD_VARS:
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def rank_seed(seed: int, rank: int) -> int:
    """The torch / numpy / python seed of rank ``rank`` once the policy is built (rank 0 of a one-process run
    never reseeds)."""
    return seed * 1009 + 7919 * (rank + 1)


class PolicyCall(torch.nn.Module):
    """``PolicyCall(policy)("evaluate", obs, extras)`` is ``policy.evaluate(obs, extras)``, run as ``forward``.

    DDP and FSDP only synchronize what runs through the wrapped module's ``forward``; a policy's RL methods are
    ``evaluate``, ``sft_loss`` and ``value``, so the wrapper routes a method name through ``forward``.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.policy, method)(*args, **kwargs)


def default_device() -> torch.device:
    """Where a one-process run puts its policy: PyTorch's current CUDA device when it sees one (hide the GPUs with
    ``CUDA_VISIBLE_DEVICES=""`` to train on the CPU), else the CPU. Env tensors stay where their simulator keeps
    them; rollouts are stored on the CPU and each minibatch meets the policy on its device."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class Distributed:
    """The ranks of this run (see the module doc). ``Distributed()`` is one process; every method is then trivial.

    Args:
        accelerator: the :class:`accelerate.Accelerator` of a multi-process run, or None.
    """

    def __init__(self, accelerator: Any = None) -> None:
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes if accelerator is not None else 1
        self.rank = accelerator.process_index if accelerator is not None else 0

    @classmethod
    def from_environment(cls) -> Distributed:
        """:data:`SINGLE` without a launcher; otherwise the process group of the launcher's ranks.

        Raises:
            ConfigError: for ``accelerate launch --cpu --num_processes N>1`` without ``--mpirun_hostfile``, which
                starts one process in accelerate 1.15 (its multi-CPU path is mpirun's); the message says what to add.
        """
        world = launched_world_size()
        if world <= 1:
            if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and os.environ.get("MASTER_ADDR"):
                raise ConfigError(
                    "accelerate launch --cpu --num_processes N started one process: accelerate starts N CPU "
                    "processes through mpirun, so add `--mpirun_hostfile configs/accelerate/localhost.hostfile` "
                    "(MPICH: pip install 'vla-rl[mpi]'), or run `accelerate launch --multi_gpu --num_processes N` "
                    "(gloo on a CPU machine) or `torchrun --nproc_per_node N` (docs/scaling.md)")
            return SINGLE
        _die_with_launcher()
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        # Unused outputs are touched with a zero weight (see touch()); find_unused_parameters covers parameters
        # a method does not reach at all (the critic in sft_loss, the action head in value).
        ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
        acc = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[ddp])
        if acc.num_processes != world:
            raise ConfigError(f"the launcher started {world} processes but accelerate joined {acc.num_processes}")
        # Leave the process group when the process exits, after the DDP model is gone: a gloo rank that exits inside
        # it can abort in C++ teardown ("terminate called without an active exception"), which mpirun reports as a
        # failed run; destroying it while the model is still alive can hang instead.
        atexit.register(acc.end_training)
        return cls(acc)

    @property
    def enabled(self) -> bool:
        """Whether there is more than one rank."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, writes checkpoints and shows progress bars."""
        return self.rank == 0

    @property
    def fsdp(self) -> bool:
        """Whether the ranks shard the policy's parameters (FSDP from ``accelerate config``) rather than replicate
        them (DDP); False with one process."""
        return self.enabled and str(self.accelerator.distributed_type).endswith("FSDP")

    @property
    def device(self) -> torch.device:
        """This rank's device (its GPU, or the CPU); one process: :func:`default_device`."""
        return self.accelerator.device if self.enabled else default_device()

    # -- sizes and seeds
    def shard(self, total: int, field: str) -> int:
        """``total / world_size``: this rank's share of a global count named ``field``.

        Raises:
            ConfigError: naming ``field`` when ``total`` does not split evenly.
        """
        if total % self.world_size:
            raise ConfigError(f"{field}={total} must be a multiple of the {self.world_size} processes "
                              f"(it is the total over all of them)")
        return total // self.world_size

    def env_shard(self, num_envs: int, seed: int, field: str = "env.num_envs") -> tuple[int, int]:
        """``(envs of this rank, seed of its first env)``: rank ``r`` holds the run's envs ``[r*n, (r+1)*n)``."""
        n = self.shard(num_envs, field)
        return n, seed + self.rank * n

    def seed_base(self, base: int, local_envs: int) -> int:
        """This rank's first training seed of an iteration whose seeds start at ``base``."""
        return base + self.rank * local_envs

    def reseed(self, seed: int, seed_all: Callable[[int], None]) -> None:
        """Give every rank its own sampling noise from here on: ``seed_all(rank_seed(seed, rank))`` under several
        processes; nothing with one (a one-process run keeps the stream it started with)."""
        if self.enabled:
            seed_all(rank_seed(seed, self.rank))

    def rank_folder(self, folder: Path) -> Path:
        """Where this rank keeps its own files under ``folder``: ``folder / rank<r>``, or ``folder`` itself with one
        process."""
        return folder / f"rank{self.rank}" if self.enabled else folder

    # -- the model
    def wrap(self, policy: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> Callable[..., Any]:
        """A caller ``call(method, *args)`` of ``policy``'s methods whose gradients are synchronized.

        One process: ``getattr(policy, method)``. Several: :class:`PolicyCall` prepared by accelerate (DDP, or
        FSDP from ``accelerate config``; FSDP is handed the optimizers too, so they follow its sharded
        parameters).
        """
        if not self.enabled:
            return lambda method, *args, **kwargs: getattr(policy, method)(*args, **kwargs)
        acc = self.accelerator
        if self.fsdp:
            model, *_ = acc.prepare(PolicyCall(policy), *optimizers)
        else:
            model = acc.prepare(PolicyCall(policy))
        return model

    def no_sync(self, caller: Any, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient all-reduce of the forward and backward inside (gradient accumulation) unless ``sync``."""
        if not self.enabled or sync:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(caller)

    def touch(self, loss: Tensor, outputs: tuple[Any, ...]) -> Tensor:
        """``loss`` plus zero times every output that has a graph, so every parameter the forward used gets a
        gradient hook in the backward (DDP's reducer waits for all of them). Identity with one process."""
        if not self.enabled:
            return loss
        for out in outputs:
            if isinstance(out, Tensor) and out.requires_grad:
                loss = loss + 0.0 * out.float().sum()
        return loss

    # -- collectives
    def sum(self, x: Tensor) -> Tensor:
        """Elementwise sum of ``x`` over ranks."""
        return self.accelerator.reduce(x.clone(), "sum") if self.enabled else x

    def total(self, n: int) -> int:
        """The count ``n`` summed over ranks (decisions, env steps)."""
        return int(self.sum(torch.tensor(n)).item())

    def gather_objects(self, items: list[Any]) -> list[Any]:
        """Every rank's ``items`` concatenated in rank order (picklable objects)."""
        if not self.enabled:
            return items
        from accelerate.utils import gather_object

        return gather_object(items)

    def all_objects(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
        return self.gather_objects([obj])

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.enabled:
            self.accelerator.wait_for_everyone()

    # -- the update
    def normalize_advantages(self, adv: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
        """:func:`vla_rl.algorithms.advantages.normalize_advantages` with the mean and std of all ranks' valid
        decisions (population std, as one process computes it on the whole rollout)."""
        from vla_rl.algorithms.advantages import normalize_advantages

        if not self.enabled:
            return normalize_advantages(adv, mask, eps)
        with torch.no_grad():
            a = adv.detach().double()
            m = mask.to(a.dtype)
            stats = self.sum(torch.stack([(a * m).sum(), m.sum()]))
            mean = stats[0] / stats[1]
            var = self.sum(((a - mean) ** 2 * m).sum()) / stats[1]
            out = ((a - mean) / (var.sqrt() + eps)).to(adv.dtype)
            return torch.where(mask, out, torch.zeros_like(out))

    def minibatches(self, flat: Tensor, total: int, minibatch_size: int) -> Iterator[Tensor]:
        """Index minibatches of this rank's valid decisions ``flat``; every rank yields the same number.

        ``total`` is the number of valid decisions over all ranks; a gradient step takes ``min(minibatch_size,
        total)`` of them, ``1 / world_size`` from each rank. A rank with fewer decisions than the others starts
        its shuffled order over (reusing some); the caller gives a rank with none a zero-weight loss. One process
        walks its shuffled order once, its last minibatch the remainder.
        """
        n = flat.numel()
        mb = max(1, math.ceil(min(minibatch_size, total) / self.world_size))
        steps = max(self.all_objects(math.ceil(n / mb)))
        perm = flat[torch.randperm(n)] if n else flat
        for j in range(steps):
            if n == 0 or (j + 1) * mb <= n or not self.enabled:
                yield perm[j * mb : (j + 1) * mb]
            else:  # past this rank's end: start its order over
                yield perm[torch.arange(j * mb, (j + 1) * mb) % n]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is True on some rank."""
        return bool(self.sum(torch.tensor(float(flag))).item() > 0) if self.enabled else flag

    # -- metrics
    def merge_scalars(self, scalars: dict[str, float], summed: tuple[str, ...] = ()) -> dict[str, float]:
        """Scalars of all ranks: the keys in ``summed`` added up, every other key averaged over the ranks that
        report it (non-finite values skipped)."""
        if not self.enabled:
            return scalars
        out: dict[str, float] = {}
        per_rank = self.all_objects(scalars)
        for key in dict.fromkeys(k for d in per_rank for k in d):
            vals = [float(d[key]) for d in per_rank if key in d and math.isfinite(float(d[key]))]
            if key in summed:
                out[key] = sum(vals)
            else:
                out[key] = sum(vals) / len(vals) if vals else float("nan")
        return out


def _die_with_launcher() -> None:
    """Ask Linux to kill this rank when its launcher dies (``kill -9`` of ``accelerate launch`` / ``torchrun``):
    a rank must never outlive it and keep writing into a run folder that is being resumed.

    torchrun (and ``accelerate launch --multi_gpu``, which runs torchrun's code in its own process) is the rank's
    parent: ``PR_SET_PDEATHSIG`` covers it. ``accelerate launch --cpu --mpirun_hostfile`` starts ``mpirun``, whose
    proxy is the parent; ``mpirun`` outlives a ``kill -9`` of ``accelerate``, so the rank also watches the
    ``accelerate`` process itself (:func:`_watch_mpi_launcher`).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the launcher died before the call
        os.kill(os.getpid(), signal.SIGKILL)
    _watch_mpi_launcher()


_MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")  # set by MPICH / Intel MPI, Open MPI in every rank
_MPI_MANAGERS = ("mpiexec", "mpirun", "hydra_", "prte", "orte")  # name prefixes of MPI's process managers


def _watch_mpi_launcher() -> None:
    """For a rank that MPI started under ``accelerate launch --cpu``: SIGKILL this rank when that ``accelerate``
    process exits (``mpirun`` then ends the other ranks). Nothing for other launchers, or for ``mpirun`` started
    by hand (a shell that exits must not end the run)."""
    if not any(os.environ.get(v) for v in _MPI_RANK_VARS) or "ACCELERATE_USE_CPU" not in os.environ:
        return
    import threading

    import psutil

    try:
        proc = psutil.Process().parent()
        while proc is not None and proc.name().startswith(_MPI_MANAGERS):
            proc = proc.parent()
        if proc is None or proc.pid == 1:  # mpirun was orphaned: accelerate is already gone
            os.kill(os.getpid(), signal.SIGKILL)
            return
        if "accelerate" not in " ".join(proc.cmdline()):
            return
    except psutil.Error:  # a process of the chain exited while it was read: the launch is ending anyway
        return
    pid = proc.pid

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)  # readable once the process exits
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGKILL)
        except OSError:  # kernels before 5.3: poll
            psutil.Process(pid).wait()
        else:
            import select

            select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="vla-rl-launcher-watch", daemon=True).start()


SINGLE = Distributed()
"""The one-process run: every collective is the identity."""
