"""Document-length statistics per split: measured per work unit, summed per input, read only where no unit could.

A tokenize job knows the split of each of its documents under ``val_fraction``
(or with no val split), so it records ``range_stats`` of its documents per
split in its statistics file (``pipeline/collect_stats.py``). Those sum exactly
(``sum_ranges``: counts and sums add, the extremes bound, the histograms'
fixed bins add), so an input's statistics are what all its documents' lengths
give, and the flow's machine reads one small record per unit. The lengths
themselves are read (``InputLengths``) only for a split no unit could know
(``val_count``: every split is gathered, and the layout wrote its document
starts) and for a reused input of a parent without statistics (its ``.bos.idx``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..manifest import Manifest
from ..stats import STATS_VERSION, hist_quantile, hist_to_pairs, length_histogram, pairs_to_hist
from .incremental import open_parent
from .model import BuildPlan
from .staging import Staging

__all__ = [
    "SHORT_DOCUMENT", "LONG_DOCUMENT", "RANGE_KEYS", "range_stats", "sum_ranges", "merge_ranges", "parent_ranges", "InputLengths",
]

SHORT_DOCUMENT = 3
"""A document of at most this many tokens (boundary tokens included) is counted as near-empty."""
LONG_DOCUMENT = 1 << 17
"""A document of at least this many tokens is counted as huge (a concatenated dump, a binary file)."""


RANGE_KEYS = ("documents", "tokens", "short_documents", "long_documents", "min_length", "max_length", "histogram")
"""What ``range_stats`` gives, in its order: an input's statistics of one split."""


def range_stats(lengths: np.ndarray) -> dict[str, Any]:
    """The statistics of documents of ``lengths`` tokens: an input's in one split, as ``stats.json`` lists them."""
    lengths = np.asarray(lengths, dtype=np.int64)
    hist = length_histogram(lengths)
    return {
        "documents": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "short_documents": int(np.count_nonzero(lengths <= SHORT_DOCUMENT)),
        "long_documents": int(np.count_nonzero(lengths >= LONG_DOCUMENT)),
        "min_length": int(lengths.min()) if len(lengths) else 0,
        "max_length": int(lengths.max()) if len(lengths) else 0,
        "histogram": hist_to_pairs(hist),
    }


def sum_ranges(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """``range_stats`` of the documents of ``parts`` together, from theirs alone (exact: counts add, extremes bound)."""
    nonempty = [p for p in parts if p["documents"]]
    return {
        "documents": sum(p["documents"] for p in parts),
        "tokens": sum(p["tokens"] for p in parts),
        "short_documents": sum(p.get("short_documents", 0) for p in parts),
        "long_documents": sum(p.get("long_documents", 0) for p in parts),
        # 0 for no documents, as range_stats says it: an empty part's 0 is no length.
        "min_length": min((p["min_length"] for p in nonempty), default=0),
        "max_length": max((p["max_length"] for p in nonempty), default=0),
        "histogram": hist_to_pairs(sum((pairs_to_hist(p["histogram"]) for p in parts), start=pairs_to_hist([]))),
    }


def merge_ranges(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A split's statistics from its inputs': their sum, with the mean and bounds on the quantiles."""
    total = sum_ranges(parts)
    hist = pairs_to_hist(total["histogram"])
    docs, tokens, top = total["documents"], total["tokens"], total["max_length"]
    return {
        **{k: total[k] for k in RANGE_KEYS if k != "histogram"},
        "mean_length": round(tokens / docs, 3) if docs else 0.0,
        # A bin's upper edge bounds the quantile, and so does the longest document.
        "p50_at_most": min(hist_quantile(hist, 0.5), top),
        "p90_at_most": min(hist_quantile(hist, 0.9), top),
        "p99_at_most": min(hist_quantile(hist, 0.99), top),
        "histogram": hist_to_pairs(hist),
    }


class _SplitLengths:
    """Document lengths of a split, by ranges of documents, from the layout's document starts.

    The starts file is mapped, not read: memory follows one input's documents, not the split's.
    """

    def __init__(self, staging: Staging, split: str, tokens: int) -> None:
        path = staging.starts(split)
        self.starts = np.memmap(path, dtype="<i8", mode="r") if path.stat().st_size else np.empty(0, dtype="<i8")
        self.tokens = tokens

    def __getitem__(self, docs: slice) -> np.ndarray:
        a, b = docs.start, min(docs.stop, len(self.starts))
        tail = np.array([self.tokens] if b == len(self.starts) else [], dtype=np.int64)
        ends = np.concatenate([np.asarray(self.starts[a + 1 : b + 1], dtype=np.int64), tail])
        return ends[: b - a] - np.asarray(self.starts[a:b], dtype=np.int64)


class InputLengths:
    """The document lengths of an input in a split its units did not measure, read only when asked.

    A gathered split has the layout's document starts (``val_count``: every
    split); a reused input, the parent's ``.bos.idx`` files (a parent without
    statistics). Everything else comes from the units' and the parent's
    statistics, without reading a document.
    """

    def __init__(self, plan: BuildPlan, staging: Staging, manifest: Manifest) -> None:
        self.plan, self.staging, self.manifest = plan, staging, manifest
        self.splits: dict[str, _SplitLengths] = {}

    def of_input(self, i: int, split: str, rng: dict[str, Any]) -> np.ndarray:
        """Input ``i``'s document lengths in ``split`` (``rng``: its range there, from the manifest's input entry)."""
        if self.staging.starts(split).exists():
            if split not in self.splits:
                self.splits[split] = _SplitLengths(self.staging, split, self.manifest.splits[split].tokens)
            a = int(rng["first_document"])
            return self.splits[split][a : a + int(rng["documents"])]
        reuse = self.plan.reuse
        if reuse is not None and i in reuse.inputs:
            r = reuse.inputs[i].splits.get(split)
            if r is None or not r.tokens:
                return np.empty(0, dtype=np.int64)
            parent = open_parent(reuse)
            starts = parent.doc_starts(split, r.first_token, r.tokens)
            if len(starts) != r.documents:
                raise parent.damaged(
                    parent.directory,
                    f"the .bos.idx files of split {split!r} list {len(starts)} documents of {reuse.inputs[i].relname}, "
                    f"its manifest {r.documents}",
                )
            return np.diff(np.append(starts, r.first_token + r.tokens))
        staging = self.staging  # a split that needs the units' records, from units that have none
        raise ConfigError(
            f"{staging.root}: the statistics files of the work units of {self.plan.inputs[i].relname} record no "
            f"document lengths of split {split!r} (written by another version of shardflow); delete "
            f"{staging.root} and build again, or build with --no-stats"
        )


def parent_ranges(stats: dict[str, Any], pentry: dict[str, Any], entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A reused input's length statistics per split from the parent's ``stats.json``: those that fit this build's layout."""
    if stats.get("stats_version") != STATS_VERSION:
        return {}  # other bins or fields: measured again
    known = {}
    for s, got in pentry.get("splits", {}).items():
        rng = entry["splits"].get(s)
        if rng is None or not set(RANGE_KEYS) <= set(got):
            continue
        if (got["documents"], got["tokens"]) == (int(rng["documents"]), int(rng["tokens"])):
            known[s] = {k: got[k] for k in RANGE_KEYS}
    return known
