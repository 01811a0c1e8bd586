"""Two clones' test runs at the same time each test their own tree.

The shared virtual environment's editable install points at whichever clone installed it last; what keeps
each clone on its own code is ``scripts/env.sh`` putting the clone's root first on ``PYTHONPATH``. The test
takes that rule from ``scripts/env.sh`` itself (the line computing ``VLA_RL_ROOT`` and the ``PYTHONPATH``
export, without the rest of the script, which may install), builds two clones holding a marker module and a
test that checks it, starts both clones' pytest runs at once, each with the *other* clone already on
``PYTHONPATH`` (as the shared install would have it), and requires each run to import its own tree. A control
run without the rule imports the other clone, so the test can tell.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MARKER_TEST = '''
import os
import time

import vla_core
import vla_core._clone_marker as marker


def test_this_clone_is_imported():
    time.sleep(1.0)  # keep both runs alive together
    assert marker.NAME == os.environ["EXPECT_CLONE"], (marker.NAME, marker.__file__)
    assert vla_core.__file__.startswith(os.environ["EXPECT_ROOT"]), vla_core.__file__
'''


def pythonpath_rule() -> str:
    """The lines of ``scripts/env.sh`` that set ``VLA_RL_ROOT`` and put it on ``PYTHONPATH``."""
    text = (REPO / "scripts" / "env.sh").read_text()
    root = re.search(r"^VLA_RL_ROOT=.*$", text, re.M)
    path = re.search(r"^export PYTHONPATH=.*VLA_RL_ROOT.*$", text, re.M)
    assert root and path, "scripts/env.sh no longer sets VLA_RL_ROOT / PYTHONPATH the way this test reads it"
    return f"{root.group(0)}\n{path.group(0)}\n"


def make_clone(base: Path, name: str) -> Path:
    root = base / f"clone-{name}"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "pythonpath_rule.sh").write_text(pythonpath_rule())
    (root / "vla_core").mkdir()
    (root / "vla_core" / "__init__.py").write_text("")
    (root / "vla_core" / "_clone_marker.py").write_text(f"NAME = {name!r}\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_marker.py").write_text(MARKER_TEST)
    return root


def start(root: Path, other: Path, name: str, rule: bool, cwd: Path) -> subprocess.Popen:
    """``pytest`` of ``root``'s marker test from a neutral folder, with ``other`` first on ``PYTHONPATH``."""
    pytest_cmd = (f"exec {sys.executable} -m pytest -q -p no:cacheprovider --rootdir {root} "
                  f"{root / 'tests' / 'test_marker.py'}")
    script = (f"source {root / 'scripts' / 'pythonpath_rule.sh'} && " if rule else "") + pytest_cmd
    env = {**os.environ, "PYTHONPATH": str(other), "EXPECT_CLONE": name, "EXPECT_ROOT": str(root),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the ROS and other plugins cost seconds to load
    return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_two_clones_tested_at_the_same_time_each_import_their_own_tree(tmp_path: Path) -> None:
    a, b = make_clone(tmp_path, "A"), make_clone(tmp_path, "B")
    neutral = tmp_path / "elsewhere"
    neutral.mkdir()
    runs = [start(a, b, "A", True, neutral), start(b, a, "B", True, neutral)]
    control = start(a, b, "A", False, neutral)  # without the rule: the other clone wins
    outs = [p.communicate(timeout=300)[0] for p in (*runs, control)]
    assert runs[0].returncode == 0, outs[0]
    assert runs[1].returncode == 0, outs[1]
    assert control.returncode == 1 and "('B'," in outs[2], outs[2]
