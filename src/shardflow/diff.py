"""Comparing two versions: inputs added, removed and changed, per-split deltas, configuration differences.

Everything comes from the two manifests (every version has one), so any two
versions compare, with or without statistics: an input is matched by its
``relname``; it *changed* when its SHA-256 differs. Per input, documents and
tokens are the sums of its ranges in the splits (the manifest's
``inputs[].splits``). ``shardflow diff REF_A REF_B`` prints ``format_diff``;
the dataset card uses ``input_changes`` for its "against the parent" section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import recorded_options
from .manifest import Manifest

__all__ = ["InputChange", "SplitDelta", "VersionDiff", "diff_versions", "format_diff", "input_changes"]


@dataclass(frozen=True, kw_only=True)
class InputChange:
    """One input in either version: ``added``, ``removed``, ``changed`` or ``same``."""

    relname: str
    status: str
    documents_a: int
    documents_b: int
    tokens_a: int
    tokens_b: int

    @property
    def documents_delta(self) -> int:
        return self.documents_b - self.documents_a

    @property
    def tokens_delta(self) -> int:
        return self.tokens_b - self.tokens_a


@dataclass(frozen=True, kw_only=True)
class SplitDelta:
    split: str
    documents_a: int
    documents_b: int
    tokens_a: int
    tokens_b: int


@dataclass(frozen=True, kw_only=True)
class VersionDiff:
    a: str
    b: str
    inputs: list[InputChange]
    splits: list[SplitDelta]
    config: list[tuple[str, Any, Any]]
    """``(key, value in a, value in b)`` of every option that differs (nested keys dotted)."""

    def count(self, status: str) -> int:
        return sum(1 for c in self.inputs if c.status == status)


def _input_sizes(entry: dict[str, Any]) -> tuple[int, int]:
    ranges = entry.get("splits", {}).values()
    return sum(int(r["documents"]) for r in ranges), sum(int(r["tokens"]) for r in ranges)


def input_changes(a: Manifest, b: Manifest) -> list[InputChange]:
    """Every input of ``a`` or ``b`` (``b``'s order, then those only in ``a``), with its status and sizes."""
    old = {e["relname"]: e for e in a.inputs}
    new = {e["relname"]: e for e in b.inputs}
    out = []
    for name in [*new, *(n for n in old if n not in new)]:
        ea, eb = old.get(name), new.get(name)
        da, ta = _input_sizes(ea) if ea else (0, 0)
        db, tb = _input_sizes(eb) if eb else (0, 0)
        if ea is None:
            status = "added"
        elif eb is None:
            status = "removed"
        elif ea.get("sha256") != eb.get("sha256"):
            status = "changed"
        else:
            status = "same"
        out.append(InputChange(relname=name, status=status, documents_a=da, documents_b=db, tokens_a=ta, tokens_b=tb))
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            flat.update(_flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def diff_versions(a: Manifest, b: Manifest) -> VersionDiff:
    """What changed from version ``a`` to version ``b``."""
    splits = []
    for split in [*b.splits, *(s for s in a.splits if s not in b.splits)]:
        sa, sb = a.splits.get(split), b.splits.get(split)
        splits.append(
            SplitDelta(
                split=split,
                documents_a=sa.documents if sa else 0,
                documents_b=sb.documents if sb else 0,
                tokens_a=sa.tokens if sa else 0,
                tokens_b=sb.tokens if sb else 0,
            )
        )
    ca = _flatten({**recorded_options(a.config), "tokenizer": a.tokenized_info.get("tokenizer"), "dtype": a.dtype})
    cb = _flatten({**recorded_options(b.config), "tokenizer": b.tokenized_info.get("tokenizer"), "dtype": b.dtype})
    config = [(k, ca.get(k), cb.get(k)) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    return VersionDiff(a=a.ref, b=b.ref, inputs=input_changes(a, b), splits=splits, config=config)


def _signed(n: int) -> str:
    return f"{n:+,}" if n else "0"


def format_diff(d: VersionDiff, *, all_inputs: bool = False) -> list[str]:
    """The diff as terminal lines (inputs that did not change are counted, not listed, unless ``all_inputs``)."""
    lines = [f"{d.a} -> {d.b}"]
    lines.append(
        f"inputs: {d.count('added')} added, {d.count('removed')} removed, {d.count('changed')} changed, "
        f"{d.count('same')} unchanged"
    )
    for c in d.inputs:
        if c.status == "same" and not all_inputs:
            continue
        lines.append(
            f"  {c.status:<8} {c.relname}  documents {c.documents_a:,} -> {c.documents_b:,} ({_signed(c.documents_delta)}), "
            f"tokens {c.tokens_a:,} -> {c.tokens_b:,} ({_signed(c.tokens_delta)})"
        )
    lines.append("splits:")
    for s in d.splits:
        lines.append(
            f"  {s.split:<6} documents {s.documents_a:,} -> {s.documents_b:,} ({_signed(s.documents_b - s.documents_a)}), "
            f"tokens {s.tokens_a:,} -> {s.tokens_b:,} ({_signed(s.tokens_b - s.tokens_a)})"
        )
    if d.config:
        lines.append("configuration:")
        for key, va, vb in d.config:
            lines.append(f"  {key}: {va!r} -> {vb!r}")
    else:
        lines.append("configuration: the same")
    return lines
