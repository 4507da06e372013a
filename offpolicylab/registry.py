"""One way to declare a part: a named builder with validated parameters (see docs/design.md, "Registries").

Objectives, worlds, policies and sweep engines are each kept in a :class:`Registry`; every parameter of every part,
and every scalar field of :class:`~offpolicylab.config.TrainConfig`, is declared with one :class:`Param`.
:meth:`Param.validate` is the only place where a command-line string or a config-file value becomes a typed value:

>>> reg = Registry("widget")
>>> reg.register("box", lambda size, colours: (size, colours),
...              {"size": Param(2, int, low=1), "colours": Param(None, list, optional=True)})
>>> reg.build("box", size="3", colours="0.5,1")
(3, (0.5, 1.0))
>>> reg.build("box", size=0)
Traceback (most recent call last):
ValueError: parameter size=0 is out of range; valid: an int in [1, inf]

A parameter is optional (``None`` allowed, spelled ``none`` / ``null`` / empty on the command line) only when it
says so; for a string parameter with choices, ``"none"`` is an ordinary choice like any other.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Largest seed a part accepts: torch and NumPy generators take every integer in 0 … 2³² − 1 exactly.
MAX_SEED = 2**32 - 1
#: Spellings of "no value" for optional parameters.
NONE_WORDS = ("none", "null", "")
_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")


@dataclass(frozen=True)
class Param:
    """One parameter: default, kind (``bool``, ``int``, ``float``, ``str``, ``list`` of floats or ``dict``), valid
    range (``low`` / ``high``, open or closed), ``choices``, ``length`` (list kind), ``optional`` (None allowed) and
    ``doc``, its help text."""

    default: Any
    kind: type = float
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    optional: bool = False
    length: int | None = None
    doc: str = ""

    def valid_text(self) -> str:
        """What a valid value looks like, for error messages."""
        if self.choices is not None:
            text = "one of " + ", ".join(map(str, self.choices))
        elif self.kind is bool:
            text = "true or false"
        elif self.kind is list:
            count = f"{self.length} " if self.length is not None else ""
            text = f"{count}comma-separated numbers"
        elif self.kind is dict:
            text = "a mapping of name -> value"
        elif self.kind in (int, float):
            lo = "-inf" if self.low is None else _bound(self.kind, self.low)
            hi = "inf" if self.high is None else _bound(self.kind, self.high)
            article = "an" if self.kind is int else "a"
            text = (f"{article} {self.kind.__name__} in {'(' if self.low_open else '['}{lo}, {hi}"
                    f"{')' if self.high_open else ']'}")
        elif self.kind is str:
            text = "a string"
        else:
            text = f"a {self.kind.__name__}"
        return text + (" or none" if self.optional else "")

    def validate(self, name: str, value: Any) -> Any:
        """``value`` (a typed value or a command-line string) as the parameter's kind, range-checked; a bad value
        raises ``ValueError`` naming the parameter and what is valid."""
        if self.optional and (value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)):
            return None
        try:
            value = coerce(self.kind, value)
        except (TypeError, ValueError):
            raise ValueError(f"parameter {name}={value!r} is invalid; valid: {self.valid_text()}") from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"parameter {name}={value!r} is invalid; valid: {self.valid_text()}")
        if self.kind is list and self.length is not None and len(value) != self.length:
            raise ValueError(f"parameter {name}={value!r} is invalid; valid: {self.valid_text()}")
        if self.kind in (int, float) and not self._in_range(value):
            raise ValueError(f"parameter {name}={value!r} is out of range; valid: {self.valid_text()}")
        return value

    def _in_range(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return not (too_low or too_high)


def doc_summary(docstring: str) -> str:
    """A part's description from its docstring, on one line: the first paragraph, and while a paragraph ends with
    ":" (it introduces a formula or a list) the next one too; whitespace collapsed, never cut mid-sentence."""
    blocks = inspect.cleandoc(docstring).split("\n\n")
    paragraphs = [" ".join(" ".join("• " + line.strip()[2:] if line.strip().startswith("- ") else line
                                    for line in block.splitlines()).split()) for block in blocks]
    paragraphs = [text for text in paragraphs if text]
    summary = paragraphs[0] if paragraphs else ""
    for text in paragraphs[1:]:
        if not summary.endswith(":"):
            break
        summary += " " + text
    return summary


def _bound(kind: type, value: float) -> str:
    return str(int(value)) if kind is int and math.isfinite(value) else f"{value:g}"


def coerce(kind: type, value: Any) -> Any:
    """``value`` as ``kind``; strings are parsed (``"true"``, ``"1e-3"``, ``"inf"``, ``"0.5,2"``).  Raises
    ``TypeError`` / ``ValueError`` when it is not one."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
            return value.strip().lower() in _TRUE_WORDS
        raise ValueError(value)
    if kind is float:
        if isinstance(value, bool):
            raise TypeError(value)
        return float(value)
    if kind is int:
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                value = float(value)
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(value)
        return int(value)
    if kind is list:
        if isinstance(value, str):
            value = [v for v in value.strip().strip("[]() ").split(",") if v.strip()]
        if isinstance(value, (str, bytes, Mapping)):
            raise TypeError(value)
        return tuple(coerce(float, v) for v in value)
    if kind is dict:
        if not isinstance(value, Mapping):
            raise TypeError(value)
        return dict(value)
    if kind is str and not isinstance(value, str):  # e.g. a number or a list from a JSON config
        raise TypeError(value)
    return kind(value)


def resolve(what: str, specs: Mapping[str, Param], given: Mapping[str, Any], *,
            fill_defaults: bool = True) -> dict[str, Any]:
    """Validate ``given`` against ``specs``: every parameter's value (the default where not given, when
    ``fill_defaults``), in the order of ``specs``.  An unknown name raises ``ValueError`` naming ``what`` and the
    valid names."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise ValueError(f"{what} has no parameter {', '.join(unknown)}; valid: {', '.join(specs) or 'none'}")
    return {key: spec.validate(key, given.get(key, spec.default)) for key, spec in specs.items()
            if fill_defaults or key in given}


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered part: its name, builder, parameter specs, one-line description and ``meta``, anything else a
    kind of part records about its members (e.g. the training settings a world suggests)."""

    name: str
    builder: Callable[..., T]
    params: dict[str, Param]
    doc: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Named parts of one kind (``"objective"``, ``"world"``, ...), in registration order.

    ``register(name, builder, params, doc, **meta)`` adds one (a duplicate name raises); called with the name alone
    it is a class decorator whose parameters come from the class's ``all_params()`` or ``params``.  ``build(name, *args,
    **params)`` validates ``params`` and calls ``builder(*args, **validated)``.
    """

    def __init__(self, kind: str, on_missing: Callable[[str], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._on_missing = on_missing  # may register a part that lives in an optional module

    def register(self, name: str, builder: Callable[..., T] | None = None, params: Mapping[str, Param] | None = None,
                 doc: str = "", **meta: Any) -> Any:
        if builder is None:
            def decorator(cls: Any) -> Any:
                self._check_new(name)
                cls.name = name
                specs = cls.all_params() if hasattr(cls, "all_params") else getattr(cls, "params", {})
                self.register(name, cls, specs, doc or doc_summary(cls.__doc__ or ""), **meta)
                return cls
            return decorator
        self._check_new(name)
        self._entries[name] = Entry(name, builder, dict(params or {}), doc, dict(meta))
        return None

    def _check_new(self, name: str) -> None:
        if name in self._entries:
            owner = getattr(self._entries[name].builder, "__name__", "another part")
            raise ValueError(f"{self.kind} {name!r} is already registered by {owner}")

    def get(self, name: str) -> Entry[T]:
        """The entry ``name``; an unknown name raises ``ValueError`` naming the valid ones."""
        if name not in self._entries and self._on_missing is not None and isinstance(name, str):
            self._on_missing(name)
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self._entries)}")
        return self._entries[name]

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a part registered by the caller, e.g. re-defined in a notebook or a test); an unknown name
        raises ``ValueError`` naming the valid ones."""
        self.get(name)
        del self._entries[name]

    def names(self) -> list[str]:
        return list(self._entries)

    def params(self, name: str) -> dict[str, Param]:
        return dict(self.get(name).params)

    def resolve(self, name: str, params: Mapping[str, Any], *, fill_defaults: bool = True) -> dict[str, Any]:
        """The validated parameters of ``name`` (see :func:`resolve`)."""
        return resolve(f"{self.kind} {name!r}", self.get(name).params, params, fill_defaults=fill_defaults)

    def build(self, name: str, *args: Any, **params: Any) -> T:
        entry = self.get(name)
        return entry.builder(*args, **self.resolve(name, params))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
