"""One registry mechanism for envs, policies, rewards and algorithms.

A registry maps a name to an object (a class or a factory) together with the
config dataclass that parametrizes it::

    ENVS = Registry("env backend")

    @ENVS.register("mujoco", config=MujocoOptions)
    def make_mujoco(task: str, num_envs: int, seed: int, options: MujocoOptions) -> VecEnv: ...

    entry = ENVS.get("mujoco")        # Entry(name, obj, config)
    entry.obj(...)

Factories look entries up by name; they never special-case a type with
``isinstance``. This module has no dependencies beyond the standard library so
that every layer (``sim``, ``policies``, ``rewards``, ``hardware``) may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate name; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text.
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object and the config dataclass it takes (or None)."""

    name: str
    obj: T
    config: type | None
    help: str


class Registry(Generic[T]):
    """A named collection of objects, each with an optional config dataclass.

    Args:
        kind: what the entries are ("env backend", "policy", ...); used in
            error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, config: type | None = None, help: str = "") -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``.

        Raises:
            RegistryError: if ``name`` is already taken.
            TypeError: if ``config`` is not a dataclass.
        """
        if config is not None and not dataclasses.is_dataclass(config):
            raise TypeError(f"{self.kind} {name!r}: config {config!r} must be a dataclass")

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            doc = help or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            self._entries[name] = Entry(name=name, obj=obj, config=config, help=doc)
            return obj

        return decorator

    def get(self, name: str) -> Entry[T]:
        """Return the entry for ``name``.

        Raises:
            RegistryError: naming the unknown ``name``, the closest matches and
                every valid name.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        """The error text for an unknown name: close matches and the full list."""
        valid = sorted(self._entries)
        close = difflib.get_close_matches(name, valid, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Valid: {', '.join(valid) or '(none registered)'}"

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries[n] for n in self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def make_config(self, name: str, **values: Any) -> Any:
        """Build ``name``'s config dataclass from keyword values.

        Raises:
            ValueError: for a key the config does not have, naming the key, the
                entry and the valid keys.
        """
        entry = self.get(name)
        if entry.config is None:
            if values:
                raise ValueError(f"{self.kind} {name!r} takes no options; got {sorted(values)}")
            return None
        fields = {f.name for f in dataclasses.fields(entry.config)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(
                f"{self.kind} {name!r}: unknown option(s) {', '.join(unknown)}; "
                f"valid options: {', '.join(sorted(fields))}"
            )
        return entry.config(**values)
