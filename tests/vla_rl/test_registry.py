from dataclasses import dataclass

import pytest

from vla_core.registry import Registry, RegistryError


@dataclass
class _Opts:
    size: int = 1


def test_register_get_and_config():
    reg: Registry = Registry("widget")

    @reg.register("square", config=_Opts)
    def square(x: int) -> int:
        """Square a number."""
        return x * x

    entry = reg.get("square")
    assert entry.obj(3) == 9 and entry.config is _Opts and entry.help == "Square a number."
    assert reg.make_config("square", size=4) == _Opts(size=4)
    assert reg.names() == ["square"] and "square" in reg and len(reg) == 1


def test_unknown_name_lists_valid_and_suggests():
    reg: Registry = Registry("widget")
    reg.register("square")(lambda: None)
    reg.register("circle")(lambda: None)
    with pytest.raises(RegistryError, match=r"unknown widget 'sqare'\. Did you mean square\? Valid: circle, square"):
        reg.get("sqare")


def test_duplicate_and_bad_options_are_errors():
    reg: Registry = Registry("widget")
    reg.register("a", config=_Opts)(object)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a")(object)
    with pytest.raises(ValueError, match="unknown option.*colour.*valid options: size"):
        reg.make_config("a", colour="red")
    with pytest.raises(TypeError, match="must be a dataclass"):
        reg.register("b", config=int)


def test_a_registry_choice_reads_its_choices_from_the_registry():
    """A config section picks an entry by ``type``; registering the entry is the only registration it needs."""
    import dataclasses

    import draccus

    from vla_core.registry import RegistryChoice

    shapes: Registry = Registry("shape")

    class ShapeConfig(RegistryChoice, draccus.ChoiceRegistry):
        choices = shapes
        default_choice = "square"

    @dataclasses.dataclass
    class SquareConfig(ShapeConfig):
        side: int = 1

    @dataclasses.dataclass
    class Scene:
        shape: ShapeConfig = dataclasses.field(default_factory=SquareConfig)

    shapes.register("square", config=SquareConfig)(object)
    assert draccus.parse(Scene, args=["--shape.side", "3"]).shape == SquareConfig(side=3)

    @dataclasses.dataclass
    class CircleConfig(ShapeConfig):
        radius: float = 1.0

    shapes.register("circle", config=CircleConfig)(object)  # registered after the section's class: still a choice
    scene = draccus.parse(Scene, args=["--shape.type", "circle", "--shape.radius", "2"])
    assert scene.shape == CircleConfig(radius=2.0) and ShapeConfig.get_choice_name(CircleConfig) == "circle"
    assert draccus.encode(scene) == {"shape": {"type": "circle", "radius": 2.0}}
    with pytest.raises(TypeError, match="register shape 'oval' with its registry's decorator"):
        ShapeConfig.register_subclass("oval", CircleConfig)
    with pytest.raises(RegistryError, match="unknown shape 'sqare'. Did you mean square"):
        ShapeConfig.get_choice_class("sqare")
