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

import importlib
import inspect
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
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
    range (``low`` / ``high``, open or closed), ``choices``, ``length`` (list kind), ``optional`` (None allowed),
    ``doc``, its help text, and ``recorded``: a run's config.json holds its value even when the run left it at the
    default (a parameter whose default has changed between versions, so a stored run keeps the value it ran with)."""

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
    recorded: bool = False

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
        elif hasattr(self.kind, "description"):
            text = self.kind.description
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
        except (TypeError, ValueError) as exc:
            why = f" ({exc})" if hasattr(self.kind, "description") and isinstance(exc, ValueError) else ""
            raise ValueError(f"parameter {name}={value!r} is invalid{why}; valid: {self.valid_text()}") from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"parameter {name}={value!r} is invalid; valid: {self.valid_text()}")
        if self.kind is list and self.length is not None and len(value) != self.length:
            raise ValueError(f"parameter {name}={value!r} is invalid; valid: {self.valid_text()}")
        if not all(self._in_range(number) for number in numbers(self.kind, value)):
            raise ValueError(f"parameter {name}={value!r} is out of range; valid: {self.valid_text()}")
        return value

    def _in_range(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return not (too_low or too_high)


def given_twice(first: str, second: str, name: str) -> str:
    """The one message for a setting given twice — in a correction spec, by two flags, as an alias and its name in
    a file: refused, naming both spellings (``first`` / ``second``, e.g. ``"--max-steps 3"``)."""
    return f"{first} and {second} name the same setting {name}; valid: one of them"


def assign(settings: dict[str, Any], item: str, malformed: str, where: str = "", strip: bool = False) -> None:
    """Add ``item`` = ``"name=value"`` to ``settings`` (the value a string, stripped when ``strip``): a ``ValueError``
    with the message ``malformed`` when it has no name or no "=", and :func:`given_twice`'s when the name is already
    set (``where`` prefixes both spellings, e.g. ``"--param "``)."""
    name, sep, value = item.partition("=")
    name, value = name.strip(), value.strip() if strip else value
    if not sep or not name:
        raise ValueError(malformed)
    if name in settings:
        raise ValueError(given_twice(f"{where}{name}={settings[name]}", f"{where}{name}={value}", name))
    settings[name] = value


def parse_json(text: str, where: str, valid: str, at: str = "line",
               parse_int: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text)``, or one ``ValueError`` line when it is not JSON: "``where``: not valid JSON (its error at
    ``at`` N); valid: ``valid``", N the line or the column of the error, or "(nested too deeply)" past the parser's
    recursion limit.  ``parse_int`` as in ``json.loads``."""
    try:
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        position = exc.lineno if at == "line" else exc.colno
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at {at} {position}); valid: {valid}") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid JSON (nested too deeply); valid: {valid}") from None


def numbers(kind: type, value: Any) -> list[float]:
    """Every number a parameter's value holds, for the range check: the value of an int / float kind, the items of
    a list, and what a custom kind's ``numbers`` reads from its value (e.g. the bounds in verl's "0.5_2.0"); NaN
    is in no range, so a NaN anywhere in a value is refused."""
    if kind in (int, float):
        return [value]
    if kind is list:
        return list(value)
    reader = getattr(kind, "numbers", None)
    return list(reader(value)) if reader is not None else []


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
    ``fill_defaults``; a ``recorded`` parameter's always), in the order of ``specs``.  An unknown name raises
    ``ValueError`` naming ``what`` and the valid names."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise ValueError(f"{what} has no parameter {', '.join(unknown)}; valid: {', '.join(specs) or 'none'}")
    return {key: spec.validate(key, given.get(key, spec.default)) for key, spec in specs.items()
            if fill_defaults or key in given or spec.recorded}


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

    ``plugins`` names an entry-point group (``offpolicylab.objectives``): an installed package that declares an
    entry point ``name = module[:attr]`` in it provides the part ``name``.  The entry point is loaded (its module
    imported, which registers the part) the first time ``name`` is asked for, and every entry point of the group
    when the names are listed (:func:`load_plugins`).
    """

    def __init__(self, kind: str, on_missing: Callable[[str], None] | None = None,
                 plugins: str | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._on_missing = on_missing  # may register a part that lives in an optional module
        self.plugins = plugins
        self._plugins_loaded: set[str] = set()  # entry-point names already loaded (or tried)

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
        self._find(name)
        if name not in self._entries:
            self.load_plugins(quiet=True)  # the valid names include every installed plugin's
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self._entries)}{self._hint()}")
        return self._entries[name]

    def _find(self, name: object, optional_module: bool = True) -> None:
        """Register ``name`` from an optional module or an installed plugin when it is not registered yet."""
        if name in self._entries or not isinstance(name, str):
            return
        if optional_module and self._on_missing is not None:
            self._on_missing(name)
        if name not in self._entries and self.plugins is not None:
            for point in plugin_entry_points(self.plugins):
                if point.name == name:
                    self._load(point, quiet=False)

    def load_plugins(self, quiet: bool = False) -> None:
        """Load every entry point of the ``plugins`` group not loaded yet.  A plugin that fails to import raises
        ``ValueError`` naming it, or with ``quiet`` is passed over with a warning."""
        for point in plugin_entry_points(self.plugins) if self.plugins is not None else ():
            self._load(point, quiet=quiet)

    def _load(self, point: metadata.EntryPoint, quiet: bool) -> None:
        if point.name in self._plugins_loaded:
            return
        self._plugins_loaded.add(point.name)
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001 - any error of a third party's module is named, not raised raw
            message = (f"{self.kind} plugin {point.name!r} ({point.value}, entry point of "
                       f"{_distribution(point)}) failed to load: {type(exc).__name__}: {exc}")
            if not quiet:
                raise ValueError(f"{message}; valid: a plugin whose module imports") from None
            warnings.warn(message, stacklevel=3)
            return
        if point.name not in self._entries:
            message = (f"{self.kind} plugin {point.name!r} ({point.value}, entry point of {_distribution(point)}) "
                       f"registered no {self.kind} named {point.name!r}")
            if not quiet:
                raise ValueError(f"{message}; valid: an entry point named as the part its module registers")
            warnings.warn(message, stacklevel=3)

    def _hint(self) -> str:
        if self.plugins is None:
            return ""
        return f" (or a module given with --import, or a package's entry point in group {self.plugins})"

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a part registered by the caller, e.g. re-defined in a notebook or a test); an unknown name
        raises ``ValueError`` naming the valid ones."""
        self.get(name)
        del self._entries[name]

    def names(self) -> list[str]:
        """Every name, installed plugins' included (a plugin that fails to load is left out with a warning)."""
        self.load_plugins(quiet=True)
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
        self._find(name, optional_module=False)
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def plugin_entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    """The entry points of ``group`` that the installed distributions (and dist-info folders on ``sys.path``)
    declare, in a stable order."""
    return tuple(sorted(metadata.entry_points(group=group), key=lambda point: (point.name, point.value)))


def _distribution(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an installed package"


def import_modules(names: str | Sequence[str], what: str = "--import") -> tuple[str, ...]:
    """Import each module of ``names`` (comma-separated, or a sequence), whose top level registers parts
    (``@register``); returns the names.  A module that cannot be imported raises ``ValueError`` in one line.  The
    current directory is searched first, as ``python -m`` does (:func:`search_current_directory`)."""
    modules = tuple(part.strip() for part in (names.split(",") if isinstance(names, str) else names)
                    if str(part).strip())
    if modules:
        search_current_directory()
    for module in modules:
        if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"{what} {module!r} is not a module name; valid: a dotted module name on the path, "
                             "e.g. my_objectives (a file my_objectives.py in the current directory or on "
                             "PYTHONPATH)")
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the user's module: its error is named in one line
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise ValueError(f"{what} {module}: the module cannot be imported ({detail}); valid: a module on the "
                             "path (the current directory or PYTHONPATH) that imports") from None
    return modules


def search_current_directory() -> None:
    """Put the current directory on ``sys.path`` (first) and on ``PYTHONPATH``, so that this process and the
    worker processes it starts (a sweep's process pool, a local Ray) import a module that lies in it."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, cwd])
