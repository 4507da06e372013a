"""Registry and Param: the one string-to-value path and the one way to declare a part."""

from __future__ import annotations

import math

import pytest

from offpolicylab.registry import Param, Registry


@pytest.mark.parametrize("param, text, value", [
    (Param(False, bool), "true", True),
    (Param(True, bool), "No", False),
    (Param(1, int), "12", 12),
    (Param(1, int), "1e3", 1000),
    (Param(0.5, float), "inf", math.inf),
    (Param(0.5, float), "2.5e-1", 0.25),
    (Param(None, list, optional=True), "0,0.8,1", (0.0, 0.8, 1.0)),
    (Param(None, list, optional=True), "[0.5, 2]", (0.5, 2.0)),
    (Param((0.5, 2.0), list, length=2), [1, 3], (1.0, 3.0)),
    (Param("a", str, choices=("a", "none")), "none", "none"),
    (Param(None, float, optional=True), "none", None),
    (Param(None, int, optional=True, low=1), "null", None),
])
def test_strings_and_values_parse_to_the_kind(param: Param, text: object, value: object) -> None:
    assert param.validate("p", text) == value
    assert param.validate("p", value) == value  # a parsed value passes unchanged


@pytest.mark.parametrize("param, value, named", [
    (Param(1, int, low=1), "0", "valid: an int in [1, inf]"),
    (Param(1, int), "1.5", "valid: an int"),
    (Param(1, int), True, "valid: an int"),
    (Param(0.5, float, low=0.0, low_open=True), 0.0, "valid: a float in (0, inf]"),
    (Param(0.5, float), "nan", "out of range"),
    (Param(False, bool), "maybe", "valid: true or false"),
    (Param("a", str, choices=("a", "b")), "c", "valid: one of a, b"),
    (Param(0.5, float), "none", "valid: a float"),  # None only for optional parameters
    (Param((0.5, 2.0), list, length=2), "1,2,3", "valid: 2 comma-separated numbers"),
    (Param({}, dict), "x", "valid: a mapping"),
])
def test_bad_values_name_the_parameter_and_what_is_valid(param: Param, value: object, named: str) -> None:
    with pytest.raises(ValueError, match="p=") as error:
        param.validate("p", value)
    assert named in str(error.value)


def test_registry_builds_with_validated_parameters_and_defaults() -> None:
    reg: Registry[tuple] = Registry("widget")
    reg.register("box", lambda owner, size, tags: (owner, size, tags),
                 {"size": Param(2, int, low=1), "tags": Param(None, list, optional=True)}, doc="a box", colour="red")
    assert reg.names() == ["box"] and "box" in reg and list(reg) == ["box"]
    assert reg.build("box", "me", size="3") == ("me", 3, None)
    assert reg.resolve("box", {"tags": "1,2"}, fill_defaults=False) == {"tags": (1.0, 2.0)}
    assert reg.get("box").doc == "a box" and set(reg.params("box")) == {"size", "tags"}
    assert reg.get("box").meta == {"colour": "red"}
    with pytest.raises(ValueError, match="unknown widget 'bag'; valid: box"):
        reg.build("bag")
    with pytest.raises(ValueError, match="widget 'box' has no parameter colour; valid: size, tags"):
        reg.build("box", "me", colour="red")
    with pytest.raises(ValueError, match="widget 'box' is already registered"):
        reg.register("box", lambda: None, {})


def test_class_decorator_takes_the_class_parameters_and_names_it() -> None:
    reg: Registry[object] = Registry("thing")

    @reg.register("spring")
    class Spring:
        """A spring."""

        params = {"k": Param(1.0, float, low=0.0)}

        def __init__(self, k: float) -> None:
            self.k = k

    assert Spring.name == "spring" and reg.get("spring").doc == "A spring."
    assert reg.build("spring", k="2").k == 2.0


def test_a_missing_name_can_be_registered_on_demand() -> None:
    reg: Registry[int] = Registry("engine", on_missing=lambda name: reg.register(name, lambda: 7, {}))
    assert reg.build("late") == 7


def test_unregister_frees_the_name_and_refuses_an_unknown_one() -> None:
    registry: Registry[object] = Registry("part")
    registry.register("a", lambda: 1)
    with pytest.raises(ValueError, match="part 'a' is already registered"):
        registry.register("a", lambda: 2)
    registry.unregister("a")
    assert "a" not in registry and registry.names() == []
    registry.register("a", lambda: 2)
    assert registry.build("a") == 2
    with pytest.raises(ValueError, match="unknown part 'b'; valid: a"):
        registry.unregister("b")
