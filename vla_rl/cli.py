"""The ``vla-rl`` command: ``vla-rl <command> [--preset NAME | --config_path FILE] [--field.sub value ...]``.

Commands are registered in :data:`vla_rl.commands.COMMANDS` with their config
dataclass; arguments are parsed by draccus. A misspelled key or a value of the
wrong type stops with the key's path and exit code 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _load_commands() -> None:
    # Importing a command module registers it.
    from vla_rl.commands import collect, deploy, quickstart, rollout, train  # noqa: F401


def preset_path(name: str) -> Path:
    """``configs/<name>.yaml``.

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


def parse_config(config_class: type, args: Sequence[str]) -> object:
    """Parse ``args`` (with optional ``--preset``) into ``config_class`` via draccus.

    Raises:
        SystemExit(2): with the offending key's path for unknown keys and bad values.
    """
    import draccus

    args = list(args)
    config_path = None
    if "--preset" in args:
        i = args.index("--preset")
        if i + 1 >= len(args):
            raise SystemExit("vla-rl: --preset needs a name")
        config_path = str(preset_path(args[i + 1]))
        del args[i : i + 2]
    if "--config_path" in args:
        i = args.index("--config_path")
        config_path = args[i + 1] if i + 1 < len(args) else None
        del args[i : i + 2]
    args = _with_choice_types(config_class, args, config_path)
    try:
        return draccus.parse(config_class, config_path=config_path, args=args)
    except (draccus.utils.ParsingError, ValueError, TypeError) as exc:
        # Validation in a __post_init__ reaches us wrapped; its own message names the field.
        wrapped = not isinstance(exc, draccus.utils.DecodingError) and exc.__cause__ is not None
        cause = exc.__cause__ if wrapped else exc
        print(f"vla-rl: invalid config: {cause}", file=sys.stderr)
        raise SystemExit(2) from None


def _with_choice_types(config_class: type, args: list[str], config_path: str | None) -> list[str]:
    """Add ``--X.type`` for choice fields (``--policy.width 64`` alone means the preset's or the default type).

    draccus only knows a choice's fields once its type is named on the command line.
    """
    import dataclasses

    import draccus
    import yaml

    preset = yaml.safe_load(Path(config_path).read_text()) if config_path else {}
    hints = __import__("typing").get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        typ = hints.get(f.name)
        if not (isinstance(typ, type) and issubclass(typ, draccus.ChoiceRegistry)):
            continue
        flag = f"--{f.name}.type"
        if flag in args or not any(a.startswith(f"--{f.name}.") for a in args):
            continue
        section = (preset or {}).get(f.name) or {}
        default = section.get("type") if isinstance(section, dict) else None
        if default is None and f.default_factory is not dataclasses.MISSING:
            default = typ.get_choice_name(type(f.default_factory()))
        args = [flag, default or typ.default_choice_name(), *args]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vla-rl`` console script: run the command, exit 0 (errors exit non-zero)."""
    run(argv)
    return 0


def run(argv: Sequence[str] | None = None) -> object:
    """Run ``vla-rl <command> ...`` and return the command's result (used by tests and notebooks)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    from vla_rl.commands import COMMANDS

    _load_commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(COMMANDS))
        return None
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vla-rl: {COMMANDS.unknown_message(name)}", file=sys.stderr)
        raise SystemExit(2)
    entry = COMMANDS.get(name)
    # A command registered without a config parses its own arguments.
    cfg = rest if entry.config is None else parse_config(entry.config, rest)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from sim import EnvError
    from vla_rl.config import ConfigError

    try:
        return entry.obj(cfg)
    except (EnvError, ConfigError, FileNotFoundError, FileExistsError) as exc:
        print(f"vla-rl {name}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        hint = " The last checkpoint is kept; rerun the same command with --resume true to continue." if hasattr(
            cfg, "resume") else ""
        print(f"\nvla-rl {name}: interrupted.{hint}", flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
