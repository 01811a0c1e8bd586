"""Run one deploy in a child process and read its outcome back as JSON: for tests that kill a ROS peer.

A ROS participant killed with SIGKILL cannot release its transport state, and the surviving
participants then tear down next to it. Should native code crash there (a segfault inside
rclpy's ``destroy_node`` once in about four full runs, with Fast DDS shared memory in use), the crash
ends only this child: the test that caused it fails with the signal and the child's stderr, instead
of the whole pytest process dying.

The child runs :func:`hardware.deploy.run_deploy` with a hook that sends ``--signal`` to
``--kill-pid`` at control step ``--kill-step`` (the arm node), records every command the runner sent
(:class:`~tests.hardware.rosutil.SentCommands`), and writes::

    {"report": {...DeployReport...}, "fired_at": wall clock of the kill, "ended": wall clock after
     run_deploy returned (teardown included), "sent": [[...], ...] point 0 of each command sent}

Run (what :func:`run_isolated_deploy` does)::

    python -m tests.hardware.isolated_deploy RESULT.json --kill-pid PID --kill-step 20 --signal SIGKILL -- <deploy args>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hardware.rosutil import REPO, AtStep, SentCommands


def run_isolated_deploy(
    deploy_args: list[str], result: Path, kill_pid: int, kill_step: int, sig: str = "SIGKILL", timeout_s: float = 120.0
) -> dict:
    """Run the deploy in a child (see the module docstring) and return its JSON outcome.

    Fails the calling test, with the child's exit signal or code and its stderr tail, when the
    child died, hung past ``timeout_s`` or wrote no outcome.
    """
    cmd = [sys.executable, "-m", __name__, str(result), "--kill-pid", str(kill_pid)]
    cmd += ["--kill-step", str(kill_step), "--signal", sig, "--", *deploy_args]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the deploy process hung for {timeout_s:.0f} s: {(e.stderr or b'')[-2000:]!r}")
    if out.returncode != 0 or not result.exists():
        how = (
            f"was killed by {signal.Signals(-out.returncode).name} (a native crash, e.g. in its ROS teardown)"
            if out.returncode < 0
            else f"exited with code {out.returncode}"
        )
        pytest.fail(f"the deploy process {how}: {out.stderr[-3000:]}")
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    from hardware.deploy import parse_config, run_deploy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result", type=Path, help="where to write the JSON outcome")
    p.add_argument("--kill-pid", type=int, required=True, help="process to signal (the arm node)")
    p.add_argument("--kill-step", type=int, required=True, help="control step at which to signal it")
    p.add_argument("--signal", default="SIGKILL", help="signal name")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, deploy_args = p.parse_args(argv[:split]), argv[split + 1 :]  # after --: the deploy config arguments
    sig = signal.Signals[args.signal]
    kill, sent = AtStep(args.kill_step, lambda: os.kill(args.kill_pid, sig)), SentCommands()
    report = run_deploy(parse_config(deploy_args), hooks=(kill, sent))
    ended = time.time()
    outcome = {
        "report": dataclasses.asdict(report),
        "fired_at": kill.fired_at,
        "ended": ended,
        "sent": [c.tolist() for c in sent.commands],
    }
    tmp = args.result.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome, default=repr))
    os.replace(tmp, args.result)  # the parent reads a whole outcome or none
    return 0


if __name__ == "__main__":
    sys.exit(main())
