"""The reader of one config section: each rule it breaks is one :class:`ConfigError` line naming the dotted key."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

__all__ = ["ConfigError", "Checker", "unknown_keys", "is_list", "plain"]


class ConfigError(ValueError):
    """A configuration value breaks a rule; the message names the key and the rule."""


def unknown_keys(section: Mapping[str, Any], prefix: str, known: Sequence[str], owner: str) -> None:
    """Raise ConfigError naming the first key of ``section`` not in ``known`` (``name`` is not listed)."""
    for key in section:
        if key in known:
            continue
        listed = [k for k in known if k != "name"]
        keys = f"has keys {', '.join(listed)}" if listed else "has no keys besides name"
        close = difflib.get_close_matches(str(key), listed, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"{prefix}{key}: unknown key; {owner} {keys}{hint}")


class Checker:
    """Reads keys of one config section and raises ConfigError naming the full key.

    Parameters
    ----------
    section : mapping
        The section (or the whole config, for the top-level keys).
    prefix : str
        What the section's keys are named after, e.g. ``"scenario."`` (``""`` at the top level).
    """

    def __init__(self, section: Mapping[str, Any], prefix: str):
        self.section = section
        self.prefix = prefix

    def fail(self, key: str, rule: str) -> None:
        value = self.section.get(key, "<missing>")
        raise ConfigError(f"{self.prefix}{key}={value!r}: {rule}")

    def get(self, key: str) -> Any:
        if key not in self.section:
            raise ConfigError(f"{self.prefix}{key} is missing")
        return self.section[key]

    def integer(self, key: str, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Integral):
            self.fail(key, "must be an integer")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}")
        return int(value)

    def number(
        self,
        key: str,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        high_open: bool = False,
    ) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            self.fail(key, "must be a finite number")
        too_low = low is not None and (value < low or (low_open and value == low))
        too_high = high is not None and (value > high or (high_open and value == high))
        if (too_low or too_high) and low is not None and high is not None:
            self.fail(key, f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")
        if too_low:
            self.fail(key, f"must be {'>' if low_open else '>='} {low}")
        if too_high:
            self.fail(key, f"must be {'<' if high_open else '<='} {high}")
        return float(value)

    def port(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= 65535:
            self.fail(key, "must be a port number in 1..65535")
        return int(value)

    def seconds(self, key: str, *, optional: bool = False) -> float | None:
        """A positive, finite number of seconds (or null when ``optional``)."""
        if optional and self.get(key) is None:
            return None
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            self.fail(key, "must be a positive number of seconds" + (" or null" if optional else ""))
        return float(value)

    def choice(self, key: str, options: Sequence[str]) -> str:
        value = self.get(key)
        if not isinstance(value, str) or value not in options:
            self.fail(key, f"must be one of {', '.join(options)}")
        return str(value)

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value

    def text(self, key: str, *, optional: bool = False) -> str | None:
        value = self.get(key)
        if optional and value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(key, "must be a non-empty string" + (" or null" if optional else ""))
        return value

    def names(self, key: str, options: Sequence[str] | None = None) -> list[str]:
        """A list of strings (each one of ``options`` when given)."""
        value = self.get(key)
        if (
            not is_list(value)
            or not all(isinstance(v, str) for v in value)
            or (options is not None and not set(value) <= set(options))
        ):
            self.fail(key, f"must be a list of: {', '.join(options)}" if options else "must be a list of names")
        return list(value)


def is_list(value: Any) -> bool:
    """A list-like config value (a list or tuple, not a string)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def plain(value: Any) -> Any:
    """A deep copy made of dicts, lists and scalars (OmegaConf containers and tuples included)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if is_list(value):
        return [plain(item) for item in value]
    return value
