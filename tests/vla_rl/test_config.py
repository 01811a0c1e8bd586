"""vla_rl.config.EnvConfig asks the sim backend about its wrist camera (no env-id prefix tests)."""

from __future__ import annotations

import pytest

from vla_rl.config import ConfigError, EnvConfig


def test_wrist_camera_on_a_backend_without_one_names_those_that_have_one():
    want = (
        r"maniskill/PickCube-v1 has no optional wrist camera \(these have: .*mujoco/\*.*always render one: .*libero/\*"
    )
    with pytest.raises(ConfigError, match=want):
        EnvConfig(id="maniskill/PickCube-v1", wrist_camera=True).make()


def test_optional_wrist_camera_is_found_through_the_backend_options():
    assert EnvConfig(id="mujoco/pick-red").has_optional_wrist_camera()
    assert not EnvConfig(id="libero/libero_object/0").has_optional_wrist_camera()  # always on: no switch
    assert not EnvConfig(id="maniskill/PickCube-v1").has_optional_wrist_camera()
