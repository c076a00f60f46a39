"""Document structure of a window: per-token document ids, masked labels, positions, cu_seqlens.

All of it is computed from the document starts inside the window (found by
binary search in the shard's ``.bos.idx``), with array operations whose cost
is one pass over the window -- never a Python loop over tokens. The fields and
what each placement masks: docs/RUNTIME.md ("Packing").
"""

from __future__ import annotations

import numpy as np

__all__ = ["IGNORE_INDEX", "pack_fields", "collate"]

IGNORE_INDEX = -100
"""The label value loss functions skip (``torch.nn.CrossEntropyLoss(ignore_index=-100)``)."""


def _arange(n: int, _cache: dict[int, np.ndarray] = {}) -> np.ndarray:
    # A read-only 0..n-1 per window length, so each sample does not rebuild it.
    ar = _cache.get(n)
    if ar is None:
        ar = np.arange(n, dtype=np.int64)
        ar.flags.writeable = False
        _cache[n] = ar
    return ar


def pack_fields(doc_starts: np.ndarray, start: int, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Packing fields of the window ``[start, start + len(labels) + 1)`` of a shard.

    ``doc_starts`` are the shard's document starts (ascending integers); ``labels``
    is masked in place. Returns ``doc_ids``, ``position_ids`` (int64) and
    ``cu_seqlens`` (int32).
    """
    seq_len = len(labels)
    ar = _arange(seq_len)
    # Document starts strictly inside the window: window positions 1..seq_len
    # (position seq_len is the last label, which is never an input).
    lo, hi = doc_starts.searchsorted((start + 1, start + seq_len + 1))
    if lo == hi:  # one document throughout: the common case for long documents
        return {
            "doc_ids": np.zeros(seq_len, dtype=np.int64),
            "position_ids": ar.copy(),
            "cu_seqlens": np.array((0, seq_len), dtype=np.int32),
        }
    rel = doc_starts[lo:hi] - start
    labels[rel - 1] = IGNORE_INDEX
    if rel[-1] == seq_len:  # a start at the last label only masks it; it opens no input segment
        rel = rel[:-1]
    bounds = np.empty(len(rel) + 2, dtype=np.int64)
    bounds[0] = 0
    bounds[1:-1] = rel
    bounds[-1] = seq_len
    lengths = bounds[1:] - bounds[:-1]
    # Two run-length expansions; a gather (bounds[doc_ids]) costs about three times as much.
    doc_ids = np.repeat(ar[: len(lengths)], lengths)
    position_ids = ar - np.repeat(bounds[:-1], lengths)
    return {"doc_ids": doc_ids, "position_ids": position_ids, "cu_seqlens": bounds.astype(np.int32)}


def collate(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Batch samples: fixed-size fields stacked; ``cu_seqlens`` flattened for the whole batch.

    For variable-length attention a batch of ``B`` packed samples is one
    sequence of ``B * seq_len`` tokens, so the batch's ``cu_seqlens`` are every
    sample's boundaries shifted by its offset (one array of int32), and
    ``max_seqlen`` is its longest segment.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    out: dict[str, np.ndarray] = {}
    for key in samples[0]:
        if key == "cu_seqlens":
            continue
        out[key] = np.stack([s[key] for s in samples])
    if "cu_seqlens" in samples[0]:
        seq_len = samples[0]["input_ids"].shape[-1]
        parts = [s["cu_seqlens"][:-1] + i * seq_len for i, s in enumerate(samples)]
        parts.append(np.array([len(samples) * seq_len], dtype=np.int32))
        cu = np.concatenate(parts).astype(np.int32, copy=False)
        out["cu_seqlens"] = cu
        out["max_seqlen"] = np.array(int(np.diff(cu).max()), dtype=np.int64)
    return out
