"""A mixture's weights and phases: their checks, and the exact per-epoch counts (``mixture_counts``).

Pure functions of the schedule, used by :class:`shardflow.runtime.mixture.MixtureDataset`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .dataset import TokenDataset

def check_weights(weights: Any, *, step: int | None = None) -> list[tuple[Any, float]]:
    """``(key, weight)`` pairs of a plain mixture (all positive) or of the phase at ``step`` (zeros allowed)."""
    where = "" if step is None else f" in the phase at step {step}"
    if isinstance(weights, Mapping):
        items = list(weights.items())
    elif isinstance(weights, Iterable) and not isinstance(weights, (str, bytes)):
        items = list(weights)
    else:
        raise ValueError(f"mixture weights{where} are {{dataset: weight, ...}} or (dataset, weight) pairs, not {weights!r}")
    if not items:
        raise ValueError(f"a mixture needs at least one dataset{where}: pass {{ref: weight, ...}}")
    out: list[tuple[Any, float]] = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError(f"mixture entries are (dataset, weight) pairs, not {item!r}")
        key, w = item
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not math.isfinite(w):
            raise ValueError(f"the weight of {source_name(key)}{where} is {w!r}; weights must be finite positive numbers")
        out.append((key, float(w)))
    if all(w == 0 for _, w in out):
        if step is None:
            raise ValueError("all mixture weights are 0; give every dataset a positive weight (e.g. {'a@latest': 0.7, 'b@latest': 0.3})")
        raise ValueError(f"all weights of the phase at step {step} are 0; give at least one dataset a positive weight")
    for key, w in out:
        if w < 0:
            allowed = "positive" if step is None else "positive, or 0 to leave a dataset out of a phase"
            raise ValueError(f"the weight of {source_name(key)}{where} is {w}; weights must be {allowed}")
        if w == 0 and step is None:
            raise ValueError(f"the weight of {source_name(key)} is 0; remove that dataset from the mixture instead")
    return out


def normalized(weights: list[float]) -> np.ndarray:
    """The weights divided by their sum."""
    total = sum(weights)
    return np.array([w / total for w in weights], dtype=np.float64)


def check_phases(phases: Any) -> tuple[list[Any], list[tuple[int, np.ndarray]]]:
    """The datasets (in the first phase's order) and each phase's ``(step, normalized weights)``."""
    if isinstance(phases, (str, bytes, Mapping)) or not isinstance(phases, Sequence) or not phases:
        raise ValueError(
            f"phases is a non-empty list of (step, {{dataset: weight}}) pairs starting at step 0, not {phases!r}"
        )
    keys: list[Any] = []
    schedule: list[tuple[int, np.ndarray]] = []
    for item in phases:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"phases are (step, {{dataset: weight}}) pairs, not {item!r}")
        step, weights = item
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"a phase's step is a global sample position (an integer >= 0), not {step!r}")
        step = int(step)
        if not schedule and step != 0:
            raise ValueError(
                f"the first phase starts at step {step}, but the schedule must start at step 0 (no weights would "
                "apply before it); make it (0, {...})"
            )
        if schedule and step == schedule[-1][0]:
            raise ValueError(f"two phases start at step {step}; give each phase its own step")
        if schedule and step < schedule[-1][0]:
            raise ValueError(
                f"phases are out of order: step {step} comes after step {schedule[-1][0]}; list them by increasing step"
            )
        entries = check_weights(weights, step=step)
        by_key: dict[Any, float] = {}
        for key, w in entries:
            if key in by_key:
                raise ValueError(f"the phase at step {step} names {source_name(key)} twice")
            by_key[key] = w
        if not schedule:
            keys = list(by_key)
        extra = [source_name(k) for k in by_key if k not in keys]
        if extra:
            raise ValueError(
                f"the phase at step {step} names {', '.join(extra)}, which the first phase does not; every phase "
                "names the same datasets (give weight 0 where one should not be read)"
            )
        missing = [source_name(k) for k in keys if k not in by_key]
        if missing:
            raise ValueError(
                f"the phase at step {step} gives no weight to {', '.join(missing)}; every phase names each of the "
                "mixture's datasets (weight 0 leaves one out of a phase)"
            )
        schedule.append((step, normalized([by_key[k] for k in keys])))
    for d, key in enumerate(keys):
        if all(w[d] == 0 for _, w in schedule):
            raise ValueError(f"{source_name(key)} has weight 0 in every phase; remove it from the mixture")
    return keys, schedule


def source_name(key: Any) -> str:
    """A mixture's dataset as messages name it."""
    if isinstance(key, TokenDataset):
        return repr(key.shards.name)
    return repr(os.fspath(key)) if isinstance(key, (str, os.PathLike)) else repr(key)


def mixture_counts(probs: np.ndarray, total: int) -> np.ndarray:
    """``probs * total`` rounded by largest remainders: non-negative ints that add up to ``total``."""
    probs = np.asarray(probs, dtype=np.float64)
    raw = probs * total
    counts = np.floor(raw).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        # A weight of 0 never gets a sample, whatever float rounding leaves over.
        remainders = np.where(probs > 0, raw - counts, -1.0)
        counts[np.argsort(-remainders, kind="stable")[:short]] += 1
    return counts


def default_epoch(probs: np.ndarray, sizes: np.ndarray) -> int:
    """The largest epoch in which no component of positive weight repeats a sample."""
    m = int(min(math.floor(n / p + 1e-9) for n, p in zip(sizes.tolist(), probs.tolist()) if p > 0))
    while m > 1 and np.any(mixture_counts(probs, m) > sizes):  # float rounding at the edge: step back
        m -= 1
    return m


def mulmod(x: np.ndarray, a: int, m: int) -> np.ndarray:
    """``x * a % m``, exact also where the product overflows int64."""
    if m < 2**31:  # x * a < 2**62: exact in int64
        return (x * a) % m
    return np.array([(int(v) * a) % m for v in x.tolist()], dtype=np.int64)
