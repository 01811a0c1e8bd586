"""CLI commands, each a function registered in :data:`COMMANDS` with its config dataclass."""

from vla_core.registry import Registry

COMMANDS: Registry = Registry("command")
