"""Pick the vector-env driver: :func:`build_vec_env`.

Backends call this one function; it sits above both drivers
(:class:`sim.vector.SerialVecEnv` and :class:`sim.vector_process.ProcessVecEnv`),
so neither driver's module imports the other's.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core import VecEnv
from sim.vector import EnvFactory, SerialVecEnv
from sim.vector_process import ProcessVecEnv


def build_vec_env(
    factories: Sequence[EnvFactory],
    env_id: str,
    num_workers: int,
    context: str = "forkserver",
    spin: bool | None = None,
) -> VecEnv:
    """``SerialVecEnv`` when ``num_workers == 0``, else ``ProcessVecEnv`` (``spin``: see there).

    Args:
        factories: one zero-argument constructor per env (called inside the worker for processes).
        env_id: the ``<backend>/<task>`` id, for specs and error messages.
        num_workers: worker processes; ``<= 0`` steps every env in this process.
        context: multiprocessing start method for the workers (``forkserver`` or ``spawn``).
        spin: busy-wait for worker replies (``None``: :class:`ProcessVecEnv` decides).
    """
    if num_workers <= 0:
        return SerialVecEnv(factories, env_id)
    return ProcessVecEnv(factories, env_id, num_workers, context, spin=spin)
