"""One registry mechanism for envs, policies, rewards and algorithms.

A registry maps a name to an object (a class or a factory) together with the
config dataclass that parametrizes it::

    ENVS = Registry("env backend")

    @ENVS.register("mujoco", config=MujocoOptions)
    def make_mujoco(task: str, num_envs: int, seed: int, options: MujocoOptions) -> VecEnv: ...

    entry = ENVS.get("mujoco")        # Entry(name, obj, config)
    entry.obj(...)

Factories look entries up by name; they never special-case a type with
``isinstance``. A config section that picks an entry by its ``type`` key
(``--policy.type``, ``--algo.type``) is a draccus choice reading the same
registry (:class:`RegistryChoice`): an entry is registered once. This module
imports nothing of the project (draccus is third-party), so every layer
(``sim``, ``policies``, ``rewards``, ``hardware``) may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

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


class RegistryChoice:
    """Mixin of a draccus choice base whose choices are the entries of a :class:`Registry` (LeRobot-style).

    ``class LearnerConfig(RegistryChoice, draccus.ChoiceRegistry)`` with ``choices = ALGORITHMS`` makes
    ``algo: LearnerConfig`` a config section whose ``type`` key (``--algo.type ppo``) names an entry of
    ``ALGORITHMS`` and whose other keys are that entry's config fields. draccus asks the registry, so the
    decorator that registers an entry is the only registration (``register_subclass`` refuses). draccus
    recognizes a choice base by ``draccus.ChoiceRegistry`` among its direct bases: list it after this mixin.
    """

    choices: ClassVar[Registry[Any]]
    """The registry whose entries (those with a config) are the choices."""
    default_choice: ClassVar[str | None] = None
    """The entry chosen when the section has no ``type`` key."""

    @classmethod
    def choice_class(cls, entry: Entry[Any]) -> type | None:
        """The dataclass a section choosing ``entry`` decodes into. Default: the entry's config."""
        return entry.config

    @classmethod
    def get_choice_class(cls, name: str) -> Any:
        """draccus: the config class of ``name``; :class:`RegistryError` (a ``KeyError``) for an unknown name."""
        choice = cls.choice_class(cls.choices.get(name))
        if choice is None:
            raise RegistryError(f"{cls.choices.kind} {name!r} takes no config")
        return choice

    @classmethod
    def get_known_choices(cls) -> dict[str, Any]:
        """draccus: every registered name with its config class."""
        known = {entry.name: cls.choice_class(entry) for entry in cls.choices}
        return {name: choice for name, choice in known.items() if choice is not None}

    @classmethod
    def get_choice_name(cls, subcls: type) -> str:
        """draccus: the registered name of config class ``subcls``; ``ValueError`` for any other class."""
        for name, choice in cls.get_known_choices().items():
            if choice is subcls:
                return name
        raise ValueError(f"{subcls.__name__} is not the config of a registered {cls.choices.kind}")

    @classmethod
    def default_choice_name(cls) -> str | None:
        """draccus: the name chosen when a section gives no ``type``."""
        return cls.default_choice

    @classmethod
    def register_subclass(cls, name: str, choice_type: type | None = None) -> Any:
        """Refused: an entry is registered once, in :attr:`choices` (see the class doc)."""
        raise TypeError(f"register {cls.choices.kind} {name!r} with its registry's decorator, not register_subclass: "
                        f"{cls.__name__} reads its choices from the {cls.choices.kind} registry")
