"""One line for a mistake that stops the configuration's composition (Hydra's), as for the validator's rules.

A command line can be wrong before there is a configuration to validate: a key typed without ``+`` that no
config file has (``scenario.label_colum=label``), a group option that does not exist (``algorithm=fedgm``), an
override Hydra's grammar cannot parse (``seed=[1``). Hydra and OmegaConf say so in several lines (with a
traceback unless caught); :func:`composition_error` says it in one, in the words of
:func:`~fedica.config.validate_config` (an unknown key lists its section's keys and suggests the closest). The
command-line tools (``fedica-run``, and ``fedica-deploy`` and the ServerApp through
``fedica.server.app.compose_config``) catch Hydra's exceptions and pass them here; this package imports neither
Hydra nor OmegaConf, so the exceptions are read by what they carry (their documented attributes and messages).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fedica.checker import closest_key, unknown_key_line
from fedica.config.schema import ATTACK_KEYS, OPTIONAL_TOP_LEVEL_KEYS, PLOT_KEYS, SECTION_KEYS, TOP_LEVEL_KEYS

__all__ = ["composition_error"]

# Hydra's MissingConfigException for a group option: "Could not find 'group/option'", then the options, each
# on a line of its own after a tab, until "Config search path:".
_MISSING_OPTION = re.compile(r"Could not find '(?P<group>.+)/(?P<option>[^/']+)'")
_OPTIONS = re.compile(r"Available options in '[^']+':\n(?P<options>(?:\t.*\n?)*)")


def composition_error(err: BaseException) -> str:
    """The one line that says why the configuration could not be composed.

    Parameters
    ----------
    err : BaseException
        What Hydra's composition raised: ``hydra.errors.OverrideParseException`` (carries ``override``),
        ``hydra.errors.ConfigCompositionException`` (from an OmegaConf ``ConfigKeyError`` or
        ``ConfigAttributeError`` with ``full_key`` and ``parent_node`` for a key that is not in the config),
        ``hydra.errors.MissingConfigException`` (an unknown group option), or any other Hydra or OmegaConf error.

    Returns
    -------
    line : str
        Without a trailing newline; names the override or the key.
    """
    override = getattr(err, "override", None)
    if isinstance(override, str):
        reason, _, rest = str(err).partition("\n")
        grammar = re.search(r"https://\S+", rest)
        return (f"{override}: not a valid override ({reason})"
                + (f"; the override grammar: {grammar.group(0)}" if grammar else ""))
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if isinstance(full_key, str) and full_key and "not in struct" in str(cause):
        return _unknown_key(full_key, getattr(cause, "parent_node", None))
    missing = _MISSING_OPTION.search(str(err))
    if missing is not None:
        return _unknown_option(missing["group"], missing["option"], str(err))
    lines = [_first_line(err)] + ([_first_line(cause)] if cause is not None else [])
    return ": ".join(line for line in lines if line)


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def _unknown_key(full_key: str, parent) -> str:
    """An unknown key, as the validator says it (its section's keys, the closest one)."""
    section, _, key = full_key.rpartition(".")
    parent_keys = [str(k) for k in parent.keys()] if isinstance(parent, Mapping) else []
    if not section:
        known, owner = TOP_LEVEL_KEYS + OPTIONAL_TOP_LEVEL_KEYS, "the top level"
    elif section == "attack":
        known, owner = ATTACK_KEYS, "attack"
    elif section == "plot":
        known, owner = PLOT_KEYS, "plot"
    elif section in SECTION_KEYS and isinstance(parent, Mapping) and parent.get("name") in SECTION_KEYS[section]:
        name = parent["name"]
        known, owner = ("name", *SECTION_KEYS[section][name]), f"{section} {name!r}"
    else:  # Hydra's own settings, or a nested section: the keys the composed config has there
        known, owner = tuple(parent_keys), section
    return unknown_key_line(key, f"{section}." if section else "", known, owner)


def _unknown_option(group: str, option: str, message: str) -> str:
    """An unknown group option, with the group's options and the closest one."""
    found = _OPTIONS.search(message)
    options = [line.strip() for line in found["options"].splitlines() if line.strip()] if found else []
    if not options:
        return f"{group}={option}: no such option of {group}"
    close = closest_key(option, options)
    hint = f" (did you mean {group}={close}?)" if close else ""
    return f"{group}={option}: no such option; {group} has {', '.join(options)}{hint}"
