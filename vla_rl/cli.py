"""The ``vla-rl`` command: ``vla-rl <command> [--preset NAME | --config_path FILE] [--field.sub value ...]``.

Commands are registered in :data:`vla_rl.commands.COMMANDS` with their config
dataclass; arguments are parsed by draccus. A misspelled key or a value of the
wrong type stops with the key's path and exit code 2.

Errors are one line on stderr, ``vla-rl <command>: <what is wrong, where, what was
expected>``, and the exit code says whose it is:

- **2, bad input**: a config value, preset, dataset, checkpoint or policy folder that
  cannot work (:class:`vla_rl.config.ConfigError` and its ``DatasetError``,
  :class:`policies.io.CheckpointError`, :class:`vla_core.manifest.IntegrityError`,
  ``ObservationError``, ``BackboneError``, an unknown registry name, a preset that is
  missing or not YAML, an env id or option the simulator rejects (``EnvConfigError``),
  a deploy config or policy folder that cannot work (``DeployInputError``);
- **1, runtime failure**: the simulator at run time (``EnvError``), the file system (``OSError``:
  an output folder that exists, a full disk) or an unexpected error;
- **130**: interrupted (Ctrl-C).

The traceback is printed only with ``--debug`` (anywhere on the command line) or the
environment variable ``VLA_RL_DEBUG=1``.
"""

from __future__ import annotations

import difflib
import os
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).parent / "configs"
"""The presets: in a clone ``vla_rl/configs`` links to the top-level ``configs/``; a wheel holds a copy (pyproject.toml)."""


def _load_commands() -> None:
    # Importing a command module registers it.
    from vla_rl.commands import align, collect, deploy, intervene, quickstart, reward, rollout, sft, train  # noqa: F401


def preset_path(name: str) -> Path:
    """The preset ``configs/<name>.yaml`` (:data:`CONFIG_DIR`).

    Raises:
        FileNotFoundError: naming the preset and listing the available ones.
    """
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"unknown preset {name!r} (no {path}); available: {', '.join(names) or 'none'}")
    return path


def _usage(commands: object) -> str:
    lines = ["usage: vla-rl <command> [--preset NAME | --config_path FILE] [--key.sub VALUE ...]", "", "commands:"]
    for entry in commands:  # type: ignore[attr-defined]
        lines.append(f"  {entry.name:<10} {entry.help}")
    lines.append("")
    lines.append("`vla-rl <command> --help` lists every field of that command.")
    return "\n".join(lines)


def parse_config(config_class: type, args: Sequence[str], prog: str | None = None) -> object:
    """Parse ``args`` (``--preset NAME`` or ``--config_path FILE``, then ``--field.sub value`` overrides) into
    ``config_class``.

    draccus parses: it reads a config file, merges the command line's overrides into it, decodes the result
    (choices by their ``type`` key) and names the key of an unknown field or a bad value. The file it reads is the
    given one on top of the values draccus cannot derive itself (:func:`_start_values`).

    Raises:
        SystemExit(2): with the offending key's path for unknown keys and bad values.
        FileNotFoundError: for an unknown preset or a missing file.
    """
    import tempfile

    import draccus
    import draccus.argparsing
    import yaml

    args = list(args)
    preset = _pop_option(args, "--preset")
    preset_file = str(preset_path(preset)) if preset else None
    config_path = _pop_option(args, "--config_path") or preset_file
    given = _read_config_file(config_path)
    start = _start_values(config_class, given, args)
    where = f" ({config_path})" if config_path else ""
    with tempfile.TemporaryDirectory(prefix="vla-rl-config-") as tmp:
        # YAML whatever the given file was (a checkpoint's config.json): draccus picks its reader by the suffix
        merged = Path(tmp) / (f"{Path(config_path).stem}.yaml" if config_path else "defaults.yaml")
        merged.write_text(yaml.safe_dump(start, sort_keys=False))
        try:
            parser = draccus.argparsing.ArgumentParser(config_class=config_class, config_path=str(merged), prog=prog,
                                                       formatter_class=_help_formatter())
            if "-h" in args or "--help" in args:
                _help_for(parser.parser, config_class, start)
            return parser.parse_args(args)
        except (draccus.utils.ParsingError, ValueError, TypeError) as exc:
            # Validation in a __post_init__ reaches us wrapped; its own message names the field.
            wrapped = not isinstance(exc, draccus.utils.DecodingError) and exc.__cause__ is not None
            print(f"vla-rl: invalid config{where}: {exc.__cause__ if wrapped else exc}", file=sys.stderr)
            raise SystemExit(2) from None


def _pop_option(args: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` from ``args`` and return VALUE (None when absent).

    Raises:
        SystemExit(2): when the flag has no value.
    """
    if flag not in args:
        return None
    i = args.index(flag)
    if i + 1 >= len(args) or args[i + 1].startswith("--"):
        print(f"vla-rl: {flag} needs a value", file=sys.stderr)
        raise SystemExit(2)
    value = args[i + 1]
    del args[i : i + 2]
    return value


def _read_config_file(path: str | None) -> dict[str, Any]:
    """The YAML (or JSON) mapping in ``path`` ({} for None).

    Raises:
        FileNotFoundError: for a missing file.
        SystemExit(2): for a file that is not YAML or not a mapping, naming the line.
    """
    import yaml

    if path is None:
        return {}
    try:
        values = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        print(f"vla-rl: invalid config: {path}:{where} not valid YAML ({getattr(exc, 'problem', None) or exc})",
              file=sys.stderr)
        raise SystemExit(2) from None
    if values is not None and not isinstance(values, dict):
        print(f"vla-rl: invalid config: {path}: expected a YAML mapping of fields, got {type(values).__name__}",
              file=sys.stderr)
        raise SystemExit(2)
    return values or {}


def _start_values(config_class: type, given: dict[str, Any], args: Sequence[str]) -> dict[str, Any]:
    """The file draccus parses ``args`` into: bottom to top, the sections ``config_class``'s default factories set,
    the sampler saved with a ``policy.path`` checkpoint, and the given config file ``given``.

    Each layer is one draccus has no notion of:

    - draccus builds a section that the file or the command line names from the section type's own defaults,
      dropping what the field's ``default_factory`` set (``vla-rl quickstart --env.num_workers 2`` would lose the
      quickstart's env id, 32 envs and wrist camera); a choice section (``policy``, ``algo``) whose type the command
      line or the file changes starts from that type's own defaults instead;
    - a checkpoint's saved sampler (:func:`_checkpoint_sampler`);
    - draccus merges a mapping field (``reward.terms``) given on the command line or in the file into the one
      below it, where ``--reward.terms '{success: 1.0}'`` means exactly that mapping (:func:`_replace_mappings`).
    """
    import dataclasses

    import draccus

    from vla_rl.config import plain_values

    hints = typing.get_type_hints(config_class)
    base: dict[str, Any] = {}
    for f in dataclasses.fields(config_class):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(value):
            continue
        typ = hints.get(f.name)
        if isinstance(typ, type) and issubclass(typ, draccus.ChoiceRegistry):
            section = given.get(f.name)
            chosen = _cli_value(args, f"--{f.name}.type") or (section.get("type") if isinstance(section, dict) else None)
            if chosen and chosen != typ.get_choice_name(type(value)):
                value = _choice(typ, f.name, chosen)()
            base[f.name] = {"type": typ.get_choice_name(type(value)), **plain_values(draccus.encode(value))}
        else:
            base[f.name] = plain_values(draccus.encode(value))
    start = _merge(_merge(base, _checkpoint_sampler(base, given, args)), given)
    _replace_mappings(config_class, start, given, args)
    return start


def _choice(typ: Any, field: str, name: str) -> type:
    """``typ``'s choice class ``name`` (``--<field>.type name``).

    Raises:
        SystemExit(2): for an unknown name, with close matches and every valid one.
    """
    known = sorted(typ.get_known_choices())
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        print(f"vla-rl: invalid config: {field}.type: unknown {field} type {name!r}.{hint} Valid: {', '.join(known)}",
              file=sys.stderr)
        raise SystemExit(2)
    return typ.get_choice_class(name)


def _checkpoint_sampler(base: dict[str, Any], given: dict[str, Any], args: Sequence[str]) -> dict[str, Any]:
    """The layer between the factory defaults and the file: the sampler saved with the ``policy.path`` checkpoint.

    So ``vla-rl train --policy.path <quickstart policy>`` samples as that policy was trained (the full Flow-SDE
    chain), not with the policy type's default sampler, and ``--policy.sampler.<field>`` still overrides any
    field of it. Empty when there is no path, the checkpoint saved no sampler, or the policy type has none;
    only fields the chosen type's sampler has are taken.
    """
    section = given.get("policy") if isinstance(given.get("policy"), dict) else {}
    path = _cli_value(args, "--policy.path") or section.get("path")
    fields = (base.get("policy") or {}).get("sampler")
    if not path or not isinstance(fields, dict):
        return {}
    from policies.io import checkpoint_config

    saved = checkpoint_config(path).get("sampler")
    if not isinstance(saved, dict):
        return {}
    return {"policy": {"sampler": {k: v for k, v in saved.items() if k in fields}}}


def _replace_mappings(config_class: type, start: dict[str, Any], given: dict[str, Any], args: Sequence[str]) -> None:
    """Make each mapping field (typed ``dict[...]``) that ``given`` or the command line sets replace the one below."""
    for path in _mapping_fields(config_class):
        *parents, name = path.split(".")
        section, mine = start, given
        for key in parents:
            section = section.get(key) if isinstance(section, dict) else None
            mine = mine.get(key) if isinstance(mine, dict) else None
        if not isinstance(section, dict):
            continue
        if isinstance(mine, dict) and name in mine:
            section[name] = mine[name]
        if _cli_value(args, f"--{path}") is not None:
            section.pop(name, None)  # the command line's mapping alone


def _mapping_fields(config_class: type, prefix: str = "") -> list[str]:
    """Dotted paths of the fields typed ``dict[...]`` (e.g. ``reward.terms``), in plain dataclass sections."""
    import dataclasses

    import draccus

    out = []
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        typ = hints.get(f.name)
        if typing.get_origin(typ) is dict:
            out.append(prefix + f.name)
        elif isinstance(typ, type) and dataclasses.is_dataclass(typ) and not issubclass(typ, draccus.ChoiceRegistry):
            out += _mapping_fields(typ, f"{prefix}{f.name}.")
    return out


def _cli_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` given as ``flag value`` or ``flag=value`` (the last one wins), else None."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def _merge(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``, section by section; a section that names another ``type`` replaces its base."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    if "type" in over and base.get("type") not in (None, over["type"]):
        return over
    return {**base, **{k: _merge(base[k], v) if k in base else v for k, v in over.items()}}


def _help_for(parser: Any, config_class: type, start: dict[str, Any]) -> None:
    """``--help`` of the command as it starts: each option's default is ``start``'s value (``--env.num_envs`` ->
    ``start["env"]["num_envs"]``), and a choice section (``policy``, ``algo``) lists the chosen type's options only.

    draccus shows the classes' defaults and the union of every registered type's fields; a user of
    ``--policy.type pi0`` wants pi0's, with the values this command and preset set.
    """
    import dataclasses

    import draccus

    missing = object()
    for action in parser._actions:
        value: Any = start
        for key in action.dest.split("."):
            value = value.get(key, missing) if isinstance(value, dict) else missing
        if value is not missing and not isinstance(value, dict):
            action.default = value
    hints = typing.get_type_hints(config_class)
    top = {fld.name for fld in dataclasses.fields(config_class)}
    for f in dataclasses.fields(config_class):
        typ, section = hints.get(f.name), start.get(f.name)
        if not (isinstance(typ, type) and issubclass(typ, draccus.ChoiceRegistry) and isinstance(section, dict)):
            continue
        chosen = typ.get_choice_class(section.get("type") or typ.default_choice_name())
        allowed = {fld.name for fld in dataclasses.fields(chosen)} | {"type"}
        others = {fld.name for choice in typ.get_known_choices().values() for fld in dataclasses.fields(choice)}
        # by group: a field two types share leaves the first type's action in its group, no longer in _actions
        for group in parser._action_groups:
            for action in list(group._group_actions):
                head, _, rest = action.dest.partition(".")
                if (head == f.name and rest and rest.partition(".")[0] not in allowed  # --policy.<another type's field>
                        or not rest and head in others - allowed - top):  # draccus's "--<section> FILE" of another type
                    group._group_actions.remove(action)
                    if action in parser._actions:
                        parser._remove_action(action)


def _help_formatter() -> type:
    """draccus's help formatter, with a literal ``%`` in a field's doc (``95% CI``) kept literal.

    argparse %-formats every help string (for ``%(default)s``), so ``10%)`` would crash ``--help``.
    """
    import re

    from draccus.help_formatter import SimpleHelpFormatter

    class HelpFormatter(SimpleHelpFormatter):
        def _get_help_string(self, action: Any) -> str | None:
            text = super()._get_help_string(action)
            return re.sub(r"%(?!\(\w+\)[sdrf])", "%%", text) if text else text

    return HelpFormatter


DEBUG_FLAG = "--debug"
DEBUG_ENV = "VLA_RL_DEBUG"


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    """The project's error types that mean bad input (exit code 2; see the module doc)."""
    from hardware.deploy import DeployInputError
    from policies.autoregressive.backbones import BackboneError
    from policies.io import CheckpointError, ObservationError
    from rewards.terms import RewardTermError
    from sim import EnvConfigError
    from vla_core.manifest import IntegrityError
    from vla_core.registry import RegistryError
    from vla_rl.config import ConfigError

    return (ConfigError, CheckpointError, IntegrityError, ObservationError, BackboneError, RegistryError,
            RewardTermError, EnvConfigError, DeployInputError)


def _one_line(exc: BaseException) -> str:
    """``exc``'s message as one line (a KeyError's without its quotes)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vla-rl`` console script: run the command, exit 0 (errors exit non-zero)."""
    run(argv)
    return 0


def run(argv: Sequence[str] | None = None) -> object:
    """Run ``vla-rl <command> ...`` and return the command's result (used by tests and notebooks).

    Raises:
        SystemExit: 2 for bad input, 1 for a runtime failure, 130 when interrupted, each after one line on
            stderr (see the module doc); with ``--debug`` or ``VLA_RL_DEBUG=1`` errors propagate with their
            traceback instead.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != DEBUG_FLAG]
    from vla_rl.commands import COMMANDS, GROUPS

    _load_commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(COMMANDS))
        return None
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vla-rl: {COMMANDS.unknown_message(name)}", file=sys.stderr)
        raise SystemExit(2)
    entry = COMMANDS.get(name)
    bad_input = _bad_input_errors()
    group = GROUPS.get(name)
    if group is not None and rest and rest[0] not in ("-h", "--help", "help"):  # vla-rl <group> <subcommand> ...
        if rest[0] not in group:
            print(f"vla-rl {name}: {group.unknown_message(rest[0])}", file=sys.stderr)
            raise SystemExit(2)
        entry, name, rest = group.get(rest[0]), f"{name} {rest[0]}", rest[1:]
    # A command registered without a config parses its own arguments.
    try:
        cfg = rest if entry.config is None else parse_config(entry.config, rest, prog=f"vla-rl {name}")
    except (*bad_input, FileNotFoundError) as exc:  # an unknown preset, a missing --config_path file
        if debug:
            raise
        print(f"vla-rl {name}: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        return entry.obj(cfg)
    except bad_input as exc:
        if debug:
            raise
        print(f"vla-rl {name}: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        hint = " The last checkpoint is kept; rerun the same command with --resume true to continue." if hasattr(
            cfg, "resume") else ""
        print(f"\nvla-rl {name}: interrupted.{hint}", flush=True)
        raise SystemExit(130) from None
    except Exception as exc:  # EnvError, OSError (an output folder that exists, a full disk), anything else
        if debug:
            raise
        from sim import EnvError

        known = isinstance(exc, EnvError | OSError)
        what = _one_line(exc) if known else f"{type(exc).__name__}: {_one_line(exc)}"
        hint = "" if known else f" (rerun with {DEBUG_FLAG} or {DEBUG_ENV}=1 for the traceback)"
        print(f"vla-rl {name}: {what}{hint}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    sys.exit(main())
