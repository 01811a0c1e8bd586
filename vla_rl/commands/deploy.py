"""``vla-rl deploy``: run a policy on a robot (LeRobot drivers or ROS 2) through the safety envelope.

The command line is parsed by :func:`hardware.deploy.parse_config` (draccus,
plus ``--dry-run``); see ``docs/hardware.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from vla_rl.commands import COMMANDS


@COMMANDS.register("deploy", help="run a policy on a robot (LeRobot or ROS 2) with safety limits; --dry-run sends nothing")
def deploy(argv: Sequence[str]) -> int:
    from hardware.deploy import main as deploy_main

    code = deploy_main(list(argv))
    if code:
        raise SystemExit(code)
    return code
