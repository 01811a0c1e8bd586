"""Close MuJoCo GL contexts at interpreter exit, while EGL still works.

A ``mujoco.Renderer`` left to the garbage collector after module teardown
prints EGL errors on exit. :func:`close_at_exit` remembers (weakly) an object
that owns renderers and closes it from an ``atexit`` hook registered after
the first GL context exists, so it runs before the ``eglTerminate`` hook that
``mujoco.egl`` registers when it makes that context (hooks run last-in,
first-out).
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_OWNERS: weakref.WeakSet[Closable] = weakref.WeakSet()  # type: ignore[type-var]
_HOOKED = False


def _close_all() -> None:
    for owner in list(_OWNERS):
        with contextlib.suppress(Exception):  # exiting anyway; one failing close must not skip the others
            owner.close()


def close_at_exit(owner: Closable) -> None:
    """Close ``owner`` at exit unless it is garbage-collected first. Call after it made its renderer."""
    global _HOOKED
    _OWNERS.add(owner)
    if not _HOOKED:
        atexit.register(_close_all)
        _HOOKED = True
