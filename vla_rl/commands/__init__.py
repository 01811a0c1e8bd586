"""CLI commands, each a function registered in :data:`COMMANDS` with its config dataclass.

A command with subcommands (``vla-rl reward train``) is a *group*: :func:`command_group` registers the group in
:data:`COMMANDS` (so ``vla-rl --help`` lists it) and returns the registry its subcommands register in; the CLI
parses ``vla-rl <group> <sub> [--field value ...]`` with the subcommand's config.
"""

from vla_core.registry import Registry

COMMANDS: Registry = Registry("command")
GROUPS: dict[str, Registry] = {}
"""Group name -> the registry of its subcommands."""


def command_group(name: str, help: str) -> Registry:
    """Register the command group ``name`` and return the registry of its subcommands.

    Raises:
        vla_core.registry.RegistryError: if ``name`` is already a command.
    """
    group: Registry = Registry(f"{name} subcommand")

    def usage(args: object) -> None:
        """Print the group's subcommands (``vla-rl <group>`` with no subcommand)."""
        print("\n".join([f"usage: vla-rl {name} <subcommand> [--field value ...]", "", "subcommands:"]
                        + [f"  {e.name:<10} {e.help}" for e in group]))

    COMMANDS.register(name, help=help)(usage)
    GROUPS[name] = group
    return group
