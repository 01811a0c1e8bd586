"""Every command in README.md's code blocks runs as written, through the installed ``vla-rl`` command.

The "Using the stack" block runs in order in one scratch folder (``collect`` writes the dataset ``sft`` reads;
``VLA_RL_RUNS`` keeps run folders there too). The README shows full-size commands; to keep this file to a few
minutes, each command gets ``--smoke true`` where it takes one and does not give it, and the longer ones their
smallest budget (:data:`BUDGET`), appended last so that it wins over the README's own value while that value still
has to parse. Run the file whole: each command may need its predecessors.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
STACK_HEADING = "## Using the stack"

SKIPPED = {
    "bash scripts/quickstart.sh": "sets up the environment (an 8 GB install) and runs the full main job; this suite "
                                  "runs inside that environment and tests/vla_rl/test_quickstart.py runs the job small",
    "bash scripts/test.sh": "sets up the environment and runs this test suite",
}
"""Commands of the README not run here, with the reason."""

SMOKE = {"train", "align"}
"""The commands that take ``--smoke true``."""

BUDGET = {
    "rollout": ["--episodes", "1", "--env.num_envs", "1"],
    "collect": ["--episodes", "2"],
    "sft": ["--steps", "2"],
    "reward train": ["--source.episodes", "8", "--fit.epochs", "1"],
}
"""The smallest budget of each command that runs for minutes at the README's size."""


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """The markdown code blocks of ``text`` (indented by four spaces, or fenced), each with the heading above it."""
    blocks: list[tuple[str, list[str]]] = []
    heading, current, fenced = "", None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            current = [] if fenced else None
            if fenced:
                blocks.append((heading, current))
        elif fenced:
            current.append(line)
        elif line.startswith("    ") and line.strip():
            if current is None:
                current = []
                blocks.append((heading, current))
            current.append(line[4:])
        elif line.strip():
            current = None
            if line.startswith("#"):
                heading = line.strip()
    return blocks


def commands(lines: list[str]) -> list[list[str]]:
    """The shell commands of a block's lines (comments dropped), as argument lists; non-commands (a layout) skipped."""
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words and words[0] in ("vla-rl", "bash", "python", "torchrun", "accelerate"):
            out.append(words)
    return out


def with_budget(words: list[str]) -> list[str]:
    """``words`` plus ``--smoke true`` (where taken and not given) and its command's :data:`BUDGET` flags."""
    name = " ".join(w for w in words[1:3] if not w.startswith("-"))
    smoke = ["--smoke", "true"] if words[1] in SMOKE and "--smoke" not in words else []
    return [*words, *smoke, *(BUDGET.get(name) or BUDGET.get(words[1], []))]


BLOCKS = code_blocks(README.read_text())
STACK = [words for heading, lines in BLOCKS if heading == STACK_HEADING for words in commands(lines)]


def test_every_readme_command_is_run_or_skipped_with_a_reason():
    every = [" ".join(words) for _, lines in BLOCKS for words in commands(lines)]
    stack = [" ".join(words) for words in STACK]
    assert stack and all(c.startswith("vla-rl ") for c in stack), f"no vla-rl commands under {STACK_HEADING!r}"
    left = [c for c in every if c not in stack and c not in SKIPPED]
    assert not left, f"README commands neither run by this test nor skipped with a reason: {left}"
    assert set(SKIPPED) <= set(every), "SKIPPED names a command the README no longer has"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One working folder for the whole block (the dataset ``collect`` writes is the one ``sft`` reads)."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("words", STACK, ids=[" ".join(w[1:3]) for w in STACK])
def test_using_the_stack_command_runs(words, scratch):
    vla_rl = Path(sys.executable).with_name("vla-rl")
    assert vla_rl.exists(), f"the vla-rl entry point is not installed beside {sys.executable}"
    argv = [str(vla_rl), *with_budget(words)[1:]]
    env = {**os.environ, "VLA_RL_RUNS": str(scratch / "runs")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    shown = shlex.join(["vla-rl", *argv[1:]])
    assert proc.returncode == 0, f"{shown} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("command", sorted(SKIPPED))
def test_setup_command_skipped(command):
    pytest.skip(f"{command}: {SKIPPED[command]}")


def test_code_blocks_parser():
    text = "# T\n\n## A\n\n    vla-rl envs   # ids\n    vla-rl x --a 1\n\ntext\n\n```bash\nbash s.sh\n```\n"
    blocks = code_blocks(text)
    assert blocks == [("## A", ["vla-rl envs   # ids", "vla-rl x --a 1"]), ("## A", ["bash s.sh"])]
    assert commands(blocks[0][1]) == [["vla-rl", "envs"], ["vla-rl", "x", "--a", "1"]]
    assert with_budget(["vla-rl", "collect", "--episodes", "50"])[-2:] == ["--episodes", "2"]
    assert with_budget(["vla-rl", "train", "--smoke", "true"]) == ["vla-rl", "train", "--smoke", "true"]
    assert with_budget(["vla-rl", "align"]) == ["vla-rl", "align", "--smoke", "true"]
    assert with_budget(["vla-rl", "reward", "train", "--kind", "classifier"])[-4:] == ["--source.episodes", "8",
                                                                                    "--fit.epochs", "1"]
