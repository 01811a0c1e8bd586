"""Pick the vector-env driver: :func:`build_vec_env`.

Backends call this one function; it sits above the drivers
(:class:`sim.vector.SerialVecEnv`, :class:`sim.vector_process.ProcessVecEnv` and
:class:`sim.vector_ray.RayVecEnv`), so no driver's module imports another's.
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
    executor: str = "process",
) -> VecEnv:
    """``SerialVecEnv`` when ``num_workers == 0``, else ``ProcessVecEnv`` (``spin``: see there), or ``RayVecEnv``
    (Ray actors, :mod:`sim.vector_ray`) with ``executor="ray"``.

    Args:
        factories: one zero-argument constructor per env (called inside the worker for processes).
        env_id: the ``<backend>/<task>`` id, for specs and error messages.
        num_workers: worker processes; ``<= 0`` steps every env in this process.
        context: multiprocessing start method for the workers (``forkserver`` or ``spawn``).
        spin: busy-wait for worker replies (``None``: :class:`ProcessVecEnv` decides).
        executor: ``process`` (worker processes) or ``ray`` (one Ray actor per worker; ``num_workers >= 1``).
    """
    if executor == "ray":
        from sim.vector_ray import RayVecEnv

        return RayVecEnv(factories, env_id, num_workers)
    if num_workers <= 0:
        return SerialVecEnv(factories, env_id)
    return ProcessVecEnv(factories, env_id, num_workers, context, spin=spin)
