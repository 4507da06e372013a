"""The profile files: the token-statistics profiles packaged with offpolicylab (``offpolicylab/data/profiles``) or
given as a path — listing, reading and validating them (docs/calibration.md, "The profile file").

A profile is data: a JSON document whose ``source`` is ``measured`` (written by ``offpolicylab calibrate``) or
``published`` (transcribed from a paper, with its ``citation``).  What its statistics mean and how they are
computed and compared is :mod:`offpolicylab.diagnostics.profile`; this module only reads files and refuses a
malformed one with one line naming what is wrong and what is valid.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

from offpolicylab.diagnostics.profile import (
    ENTROPY_BIN_EDGES,
    HISTOGRAM_SHARES,
    STATISTICS,
    VERY_LOW_ENTROPY,
    Statistic,
    histogram_share,
)
from offpolicylab.registry import parse_json

PACKAGED_PROFILES = "data/profiles"
"""Where the committed profiles live inside the ``offpolicylab`` package (written by ``offpolicylab calibrate``)."""

PROFILE_VERSION = 2
SOURCES = ("measured", "published")


def list_profiles() -> list[str]:
    """The names of the profiles packaged with offpolicylab (:data:`PACKAGED_PROFILES`), sorted."""
    folder = resources.files("offpolicylab").joinpath(PACKAGED_PROFILES)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> dict[str, Any]:
    """A validated profile document (:func:`validate_profile`): a packaged one by name or by a prefix naming one
    (``"smollm2"``, ``"qwen3_8b_cot"``; see :func:`list_profiles`) or a JSON file path.  A file written before
    version 2 comes back upgraded (:func:`validate_profile`).  A bad name or a malformed file raises ``ValueError``
    with one line naming what is wrong and what is valid."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        return validate_profile(_read_json(path.read_bytes(), str(path)), str(path))
    names = list_profiles()
    text = str(name_or_path)
    matches = [n for n in names if n == text] or ([n for n in names if n.startswith(text)] if text else [])
    if len(matches) != 1:
        what = "names more than one" if matches else "is not"
        raise ValueError(f"profile {text!r} {what} a packaged profile; valid: a profile JSON file or one of {names} "
                         "(or a prefix naming one)")
    packaged = resources.files("offpolicylab").joinpath(PACKAGED_PROFILES, f"{matches[0]}.json")
    return validate_profile(_read_json(packaged.read_bytes(), matches[0]), matches[0])


def validate_profile(doc: Any, name: str = "profile") -> dict[str, Any]:
    """``doc`` checked against the profile schema (docs/calibration.md, "The profile file"), as a version-2
    document; raises ``ValueError`` with one line ``profile NAME: WHAT; valid: ...`` at the first violation.

    Version 2: ``profile_version`` 2, ``source`` (``measured`` | ``published``), ``model`` (a string), ``profile``
    holding every statistic of :data:`STATISTICS` plus ``entropy_bin_edges``, ``entropy_histogram`` and
    ``neg_logp_percentiles``.  A published profile needs ``citation`` (authors, year, title, where, and arxiv or
    url); its statistics may be null (not given by the paper), and ``quotes`` may give the paper's words per
    statistic.  A measured profile's statistics are numbers, except those it lists in ``not_recorded``.  Shares lie
    in [0, 1], entropies are ≥ 0, the median is at most the 0.8 quantile, the histogram (when given) has the
    standard edges, sums to 1 and agrees with the shares it implies.  Version 1 (``offpolicylab calibrate`` before
    the schema) is read as measured: its share below 0.01 nat is the sum of its histogram bins below that edge (an
    exact count), its 0.8 quantile is null and listed in ``not_recorded``."""
    where = f"profile {name}"
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: the file holds a JSON {_json_type(doc)}; valid: a JSON object (docs/calibration.md)")
    if doc.get("profile_version") == 1:
        doc = _upgrade_v1(doc, where)
    if doc.get("profile_version") != PROFILE_VERSION:
        raise ValueError(f"{where}: profile_version={doc.get('profile_version')!r}; valid: 1 or {PROFILE_VERSION}")
    source = doc.get("source")
    if source not in SOURCES:
        raise ValueError(f"{where}: source={source!r}; valid: one of {list(SOURCES)}")
    if not isinstance(doc.get("model"), str) or not doc["model"]:
        raise ValueError(f"{where}: model={doc.get('model')!r}; valid: a non-empty string naming the model")
    stats = doc.get("profile")
    if not isinstance(stats, dict):
        raise ValueError(f"{where}: 'profile' is {_json_type(stats)}; valid: a JSON object of statistics")
    sampling = doc.get("sampling", {})
    temperature = sampling.get("temperature") if isinstance(sampling, dict) else None
    if not isinstance(sampling, dict) or not (temperature is None or (isinstance(temperature, (int, float))
                                                                      and not isinstance(temperature, bool))):
        raise ValueError(f"{where}: sampling={_shown(sampling)}; valid: a JSON object of the sampling settings, "
                         'e.g. {"temperature": 1.0} (docs/calibration.md)')
    if source == "published":
        _check_citation(doc.get("citation"), where)
    not_recorded = doc.get("not_recorded", [])
    if not isinstance(not_recorded, list) or not all(isinstance(key, str) for key in not_recorded) \
            or not set(not_recorded) <= {s.key for s in STATISTICS}:
        raise ValueError(f"{where}: not_recorded={not_recorded!r}; valid: a list of statistic names")
    _check_statistics(stats, where, nulls_allowed=None if source == "published" else set(not_recorded))
    quotes = doc.get("quotes", {})
    if not isinstance(quotes, dict) or not all(isinstance(v, str) for v in quotes.values()) \
            or not set(quotes) <= {s.key for s in STATISTICS}:
        raise ValueError(f"{where}: quotes must map statistic names to the paper's words; valid keys: "
                         f"{[s.key for s in STATISTICS]}")
    return doc


def _shown(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _upgrade_v1(doc: dict[str, Any], where: str) -> dict[str, Any]:
    stats = doc.get("profile")
    if not isinstance(stats, dict) or stats.get("entropy_histogram") is None:
        raise ValueError(f"{where}: a version-1 profile needs 'profile' with its entropy histogram; valid: a file "
                         "written by offpolicylab calibrate")
    stats = dict(stats)
    _check_histogram(stats, where)
    stats["share_entropy_below_0.01"] = histogram_share(stats, None, VERY_LOW_ENTROPY)
    stats["entropy_p80"] = None
    return {**doc, "profile_version": PROFILE_VERSION, "source": "measured", "profile": stats,
            "not_recorded": ["entropy_p80"],
            "derived": {"share_entropy_below_0.01": "sum of the histogram's bins below 0.01 nat (a bin edge)"}}


def _check_citation(citation: Any, where: str) -> None:
    valid = "valid: {authors, year, title, where, and arxiv or url} (docs/calibration.md)"
    if not isinstance(citation, dict):
        raise ValueError(f"{where}: a published profile needs a citation object; {valid}")
    for key in ("authors", "title", "where"):
        if not isinstance(citation.get(key), str) or not citation[key].strip():
            raise ValueError(f"{where}: citation.{key}={citation.get(key)!r}; {valid}")
    year = citation.get("year")
    if not isinstance(year, int) or isinstance(year, bool) or not 1900 <= year <= 2100:
        raise ValueError(f"{where}: citation.year={year!r}; valid: an integer year such as 2025")
    if not any(isinstance(citation.get(k), str) and citation[k].strip() for k in ("arxiv", "url")):
        raise ValueError(f"{where}: citation has neither arxiv nor url; {valid}")


def _check_statistics(stats: dict[str, Any], where: str, nulls_allowed: set[str] | None) -> None:
    """Every statistic present, of its kind and range (null only where ``nulls_allowed`` says: None = anywhere)."""
    known = {s.key for s in STATISTICS} | {"entropy_bin_edges", "entropy_histogram", "neg_logp_percentiles"}
    unknown = sorted(set(stats) - known)
    if unknown:
        raise ValueError(f"{where}: unknown statistic {unknown[0]!r}; valid: {sorted(known)}")
    missing = sorted(known - set(stats))
    if missing:
        raise ValueError(f"{where}: statistic {missing[0]!r} is missing; valid: a number, or null where the source "
                         "does not give it (published) or lists it in not_recorded (measured)")
    for stat in STATISTICS:
        value = stats[stat.key]
        if value is None:
            if nulls_allowed is not None and stat.key not in nulls_allowed:
                raise ValueError(f"{where}: {stat.key} is null in a measured profile; valid: a number (or list it "
                                 "in not_recorded)")
            continue
        _check_value(stat, value, where)
    if stats["entropy_bin_edges"] is not None or stats["entropy_histogram"] is not None:
        _check_histogram(stats, where)
        for key, (low, high) in HISTOGRAM_SHARES.items():
            if stats[key] is not None and abs(stats[key] - histogram_share(stats, low, high)) > 1e-9:
                raise ValueError(f"{where}: {key}={stats[key]} but its histogram bins sum to "
                                 f"{histogram_share(stats, low, high)}; valid: the two agree")
    elif nulls_allowed is not None:
        raise ValueError(f"{where}: a measured profile needs entropy_bin_edges and entropy_histogram; valid: the "
                         "lists offpolicylab calibrate writes")
    median, p80 = stats["median_entropy"], stats["entropy_p80"]
    if median is not None and p80 is not None and median > p80:
        raise ValueError(f"{where}: median_entropy={median} exceeds entropy_p80={p80}; valid: quantile 0.5 <= 0.8")
    percentiles = stats["neg_logp_percentiles"]
    if percentiles is not None and (not isinstance(percentiles, dict) or not all(
            _is_number(v) and v >= 0 for v in percentiles.values())):
        raise ValueError(f"{where}: neg_logp_percentiles={percentiles!r}; valid: null or an object of numbers >= 0")


def _check_value(stat: Statistic, value: Any, where: str) -> None:
    if stat.kind == "count":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: {stat.key}={value!r}; valid: an integer >= 1 or null")
    elif not _is_number(value) or value < 0 or (stat.kind == "share" and value > 1):
        valid = "a number in [0, 1]" if stat.kind == "share" else "a number >= 0 (nats)"
        raise ValueError(f"{where}: {stat.key}={value!r}; valid: {valid} or null")


def _check_histogram(stats: dict[str, Any], where: str) -> None:
    edges, hist = stats.get("entropy_bin_edges"), stats.get("entropy_histogram")
    standard = [None if math.isinf(e) else e for e in ENTROPY_BIN_EDGES]
    if edges != standard:
        raise ValueError(f"{where}: entropy_bin_edges={edges!r}; valid: {standard} (the last edge inf as null)")
    if not isinstance(hist, list) or len(hist) != len(standard) - 1 or not all(
            _is_number(v) and 0 <= v <= 1 for v in hist) or abs(sum(hist) - 1.0) > 1e-6:
        raise ValueError(f"{where}: entropy_histogram must hold {len(standard) - 1} shares in [0, 1] summing to 1; "
                         f"got {hist!r}")


#: The most digits an integer in a profile may have (``float(10**400)`` overflows).
MAX_DIGITS = 100


def _read_json(data: bytes | str, where: str) -> Any:
    """The JSON document of the profile file ``where``: UTF-8, integers of at most :data:`MAX_DIGITS` digits, nested
    at most as deep as Python's parser goes; anything else is one ``ValueError`` line naming the file."""
    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_DIGITS:
            raise ValueError(f"profile {where}: a number of {len(digits.lstrip('-'))} digits; valid: at most "
                             f"{MAX_DIGITS} digits")
        return int(digits)

    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"profile {where}: not UTF-8 text ({exc.reason} at byte {exc.start}); valid: a JSON "
                             "object in UTF-8 (docs/calibration.md)") from None
    return parse_json(data, f"profile {where}", "a JSON object (docs/calibration.md)", parse_int=bounded_int)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
