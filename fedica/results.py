"""The result of a run: JSON-safe conversion, atomic writing, versions and a short summary."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from fedica.persistence import write_atomic

RESULT_FILE = "result.json"
# What a run that stopped early had computed; a sweep does not count it as complete.
PARTIAL_RESULT_FILE = "partial_result.json"
SUMMARY_FILE = "summary.txt"


def to_jsonable(value: Any) -> Any:
    """Turn numpy scalars and arrays (nested in dicts, lists, tuples) into plain JSON values.

    Non-finite floats become ``None`` so the file stays strict JSON.
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as JSON so that ``path`` is either absent or complete (:func:`write_atomic`)."""
    return write_atomic(path, lambda handle: handle.write(
        json.dumps(to_jsonable(data), indent=2, allow_nan=False).encode()))


def is_complete_result(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a complete result JSON (used to skip finished runs of a sweep)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "metrics" in data and "timings" in data


def versions() -> dict[str, str]:
    """Installed versions of fedica and the libraries whose behaviour shapes a result."""
    found = {}
    for dist in ("fedica", "flwr", "numpy", "scipy", "scikit-learn", "hydra-core"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def format_summary(result: Mapping[str, Any]) -> str:
    """A short human-readable table of a result: one row per method, then clients and time."""
    metrics: Mapping[str, Mapping[str, Any]] = result.get("metrics", {})
    columns: list[str] = []
    for values in metrics.values():
        columns.extend(k for k in values if k not in columns)
    header = ["method"] + columns + ["fit s"]
    rows = [header]
    timings = result.get("timings", {})
    for method, values in metrics.items():
        row = [method] + [_format_number(values.get(c)) for c in columns]
        row.append(_format_number(timings.get(method)))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    attack = result.get("config", {}).get("attack") or {}
    attack_note = ""
    if attack.get("kind", "none") != "none":
        section = result.get(result.get("algorithm", ""), {}) or {}
        attack_note = (f", attack {attack['kind']} at {attack.get('fraction', 0):.0%}: hostile clients "
                       f"{section.get('hostile_clients', '?')}")
    lines = [
        f"{result.get('algorithm', '?')} on {result.get('scenario', {}).get('name', '?')} "
        f"(engine {result.get('engine', '?')}, seed {result.get('seed', '?')}{attack_note})"
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    clients = result.get("clients", {})
    rejected = clients.get("rejected", [])
    lines.append(
        f"clients: {clients.get('answered', '?')} of {clients.get('expected', '?')} answered"
        + (f", {len(rejected)} replies rejected" if rejected else "")
    )
    for item in rejected[:10]:
        lines.append(f"  rejected client {item['client']} (round {item['round']}): {item['reason']}")
    resumed = result.get("resumed")
    if isinstance(resumed, dict):
        lines.append(f"resumed: the first {resumed.get('replayed_stages', '?')} stages were replayed from the journal "
                     f"of an interrupted run ({resumed.get('journal', '?')})")
    if len(rejected) > 10:
        lines.append(f"  ... and {len(rejected) - 10} more (see result.json)")
    # The library's own warnings about the result (UserWarning: a site at its K_g bound, features in different
    # units), not the expected ones of ordinary runs (an EM start at its iteration limit), which result.json counts.
    for warning, count in result.get("warnings", {}).items():
        if warning.startswith("UserWarning: "):
            lines.append(f"warning: {warning.removeprefix('UserWarning: ')}" + (f" ({count} times)" if count > 1 else ""))
    line = pooled_bic_line(metrics)
    if line:
        lines.append(line)
    support = (result.get("fedgem") or {}).get("k_support")
    if support:
        lines.append(k_support_line(support))
    tuning = (result.get("fedgem") or {}).get("upsilon_tuning") or {}
    if "family" in tuning:  # covariance_type diag, full or auto (docs/ALGORITHMS.md 2.14)
        lines.append(f"covariance family: {tuning['family']}, chosen by the BIC after {tuning['family_em_steps']} "
                     f"federated EM steps from the {tuning['family_start_k']} clusters of the spheres")
    privacy = result.get("privacy")
    if privacy:
        # A result written before the noise's seed was recorded has no "noise".
        noise = f", noise {privacy['noise']}" if "noise" in privacy else ""
        lines.append(f"privacy: epsilon {privacy['epsilon']:.4g}, delta {privacy['delta']:.3g} per {privacy['unit']} "
                     f"({privacy['accountant']} accountant, noise multiplier {privacy['noise_multiplier']:.4g}, "
                     f"clip {privacy['clip']:g}{noise}); per exchange: "
                     + ", ".join(f"{e['exchange']} {e['epsilon']:.3g}" for e in privacy["exchanges"]))
    lines.append(f"run time: {_format_number(timings.get('total'))} s (the federation's run; not the engine's start-up)")
    return "\n".join(lines)


# The BIC differences below which two models' fits are not told apart, and above which one is strongly preferred
# (Kass and Raftery 1995: 2, "positive", and 6, "strong").
BIC_EVIDENCE = 2.0
STRONG_BIC_EVIDENCE = 6.0


def pooled_bics(metrics: Mapping[str, Mapping[str, Any]]) -> tuple[float, float] | None:
    """FedGEM's and the central analyst's (``central-gmm-bic``) BIC on the pooled training points, where a run has both."""
    ours = (metrics.get("fedgem") or {}).get("pooled_bic")
    central = (metrics.get("central-gmm-bic") or {}).get("pooled_bic")
    return None if ours is None or central is None else (ours, central)


def pooled_bic_line(metrics: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The summary's line comparing FedGEM's mixture with the central analyst's (:func:`pooled_bics`): where their
    ARIs differ, whether the federation's mixture is the worse fit of the data or the better one."""
    if (bics := pooled_bics(metrics)) is None:
        return None
    ours, central = bics
    # Kass and Raftery's scale: a BIC difference under 2 is not worth more than a bare mention.
    verdict = ("the same fit" if np.isclose(ours, central, rtol=1e-9, atol=1e-6) else
               "within 2 of each other, no evidence either way" if abs(ours - central) < BIC_EVIDENCE else
               f"FedGEM's mixture the better fit by {central - ours:.1f}" if ours < central else
               f"the central mixture the better fit by {ours - central:.1f}")
    return (f"pooled BIC (the central analyst's criterion, on the pooled training points; lower is better): fedgem "
            f"{ours:.1f}, central-gmm-bic {central:.1f}: {verdict}")


# The summary lists how many sites hold each cluster up to this many clusters, and their range beyond.
SUPPORT_CLUSTERS_LISTED = 12


def k_support_line(support: Mapping[str, Any]) -> str:
    """The summary's line on how sure K_hat is: each candidate K's weight, and how many sites hold each cluster."""
    if "weight" not in support:
        weights = f"no weights under the {support.get('criterion') or 'fixed upsilon'}"
    elif len(support["k"]) == 1:
        weights = f"K={support['k'][0]}, the only K among the candidates the sites scored"
    else:
        # result.json keeps every candidate; the line names those with a weight it can print (and the chosen K).
        shown, rest = [], []
        for k, w in zip(support["k"], support["weight"]):
            if w >= 0.005 or k == support.get("chosen"):
                shown.append((k, w))
            else:
                rest.append(k)
        weights = "weights " + ", ".join(f"K={k} {w:.2f}" for k, w in shown)
        if rest:
            others = f"{len(rest)} other candidates, K={min(rest)} to {max(rest)}" if len(rest) > 1 else f"1 other candidate, K={rest[0]}"
            weights += f" ({others}, under 0.01)"
    counts = [c["sites"] for c in support["clusters"]]
    if len(counts) <= SUPPORT_CLUSTERS_LISTED:
        held = ", ".join(f"{count}" for count in counts)
    else:
        held = f"{min(counts)} to {max(counts)} (median {float(np.median(counts)):g}) over {len(counts)} clusters"
    widest = max((c["spread_max"] for c in support["clusters"] if c["spread_max"] is not None), default=None)
    spread = f"; components at most {widest:.2f} radii from their cluster's centre" if widest is not None else ""
    return f"K_hat support: {weights}; sites holding each cluster: {held}{spread}"


def _format_number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)
