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
