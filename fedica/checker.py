"""The reader of one config section: each rule it breaks is one :class:`ConfigError` line naming the dotted key.

A validation reports every independent broken rule at once: :class:`Errors` runs each rule and keeps its
lines, and raises one :class:`ConfigError` of all of them at the end.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

__all__ = ["ConfigError", "Errors", "Checker", "unknown_keys", "unknown_key_line", "closest_key", "is_list", "plain"]


class ConfigError(ValueError):
    """Configuration values break rules; the message is one line per broken rule, naming the key and the rule."""

    @property
    def errors(self) -> list[str]:
        """The broken rules, one line each, in the order they were found."""
        return str(self).splitlines()


class Errors:
    """The broken rules of one validation, in the order found: :meth:`check` runs one independent rule."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def check(self, rule: Callable[..., Any], *args: Any) -> bool:
        """Run ``rule(*args)``; False when it raises ConfigError, whose lines are kept (each line once)."""
        try:
            rule(*args)
        except ConfigError as err:
            self.add(*err.errors)
            return False
        return True

    def add(self, *lines: str) -> None:
        """Keep broken rules' lines (a line already kept is not repeated)."""
        self.lines.extend(line for line in lines if line not in self.lines)

    def raise_any(self) -> None:
        """Raise one ConfigError of every line kept, if any."""
        if self.lines:
            raise ConfigError("\n".join(self.lines))


def closest_key(key: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` that ``key`` most likely misspells, or None."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return close[0] if close else None


def unknown_keys(section: Mapping[str, Any], prefix: str, known: Sequence[str], owner: str) -> None:
    """Raise ConfigError naming every key of ``section`` not in ``known`` (``name`` is not listed), one a line."""
    lines = [unknown_key_line(key, prefix, known, owner) for key in section if key not in known]
    if lines:
        raise ConfigError("\n".join(lines))


def unknown_key_line(key: str, prefix: str, known: Sequence[str], owner: str) -> str:
    """The line for a key its section does not have: the section's keys (``name`` not listed), the closest."""
    listed = [k for k in known if k != "name"]
    keys = f"has keys {', '.join(listed)}" if listed else "has no keys besides name"
    close = closest_key(key, listed)
    hint = f" (did you mean {prefix}{close}?)" if close else ""
    return f"{prefix}{key}: unknown key; {owner} {keys}{hint}"


class Checker:
    """Reads keys of one config section and raises ConfigError naming the full key.

    Parameters
    ----------
    section : mapping
        The section (or the whole config, for the top-level keys).
    prefix : str
        What the section's keys are named after, e.g. ``"scenario."`` (``""`` at the top level).

    Attributes
    ----------
    broken : set of str
        The keys whose rules have failed so far (a missing key included).
    """

    def __init__(self, section: Mapping[str, Any], prefix: str):
        self.section = section
        self.prefix = prefix
        # The keys whose rules have failed: a later rule that needs one of them skips it (one line per mistake).
        self.broken: set[str] = set()

    def fail(self, key: str, rule: str) -> None:
        self.broken.add(key)
        value = self.section.get(key, "<missing>")
        raise ConfigError(f"{self.prefix}{key}={value!r}: {rule}")

    def each(self, *rules: Callable[[], Any]) -> None:
        """Run independent rules of the section, then raise one ConfigError of every one broken."""
        errors = Errors()
        for rule in rules:
            errors.check(rule)
        errors.raise_any()

    def get(self, key: str) -> Any:
        if key not in self.section:
            self.broken.add(key)
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
