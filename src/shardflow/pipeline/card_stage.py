"""The stats-card stage: merge the statistics into ``stats.json`` and draw the card's plots, right after the layout.

Everything they show is known once the layout is committed (the units' statistics, the shard
sizes, the parent's statistics: one small record per unit and per shard), so this one job runs
beside the write-shard jobs, which mostly wait on memcpy, the disk and hashing
with the GIL released, rather than in ``finalize`` on the build's critical path (``Stage.joins``).

It writes ``stats.json``, ``stats.vocab.npy`` and ``card/*.png`` into ``out/``, then its marker
``layout/card.json``: the manifest's ``stats`` section and each PNG's SHA-256. ``card_done`` accepts
the marker only when the files still match it, so a job killed halfway is redone, with the same
bytes. ``finalize`` takes the recorded result, or runs the job itself when it finds none, then
writes ``card/README.md`` from the final manifest: the only part of the card that names the build.
A plot that fails is a warning; a statistics error fails the build.

The plots are drawn without matplotlib (``card_draw``): about 0.1 s for all four in a fresh process,
against 0.8-1.0 s with matplotlib's import, which held an incremental build's publish back by a
second. So the card stays part of the version, drawn before publish, and the stage's cost is
merging the statistics (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, sha256_file
from ..card import CARD_DIR, card_wanted, draw_plots
from ..catalog import Catalog
from ..manifest import Manifest
from ..tokenizers import load_tokenizer
from .layout import read_layout, unit_results
from .assemble import TokenizerInfo, assemble_manifest
from .model import BuildPlan
from .staging import Staging, as_plan
from .collect_stats import collecting, write_stats
from .target_files import tokenizer_file_name

__all__ = ["CardResult", "draw_card", "card_done", "parent_dir", "shard_tokens"]

log = logging.getLogger("shardflow.pipeline")


@dataclass(frozen=True, kw_only=True)
class CardResult:
    """What the stats-card stage left in ``out/``: the manifest's ``stats`` section and the card's plots."""

    stats: dict[str, Any] | None
    """The manifest's ``stats`` section (``stats.json``, ``stats.vocab.npy``: bytes, SHA-256); None: collection off."""
    card: bool
    """Whether the build wanted the card (``BuildConfig.card``) when it was drawn."""
    plots: dict[str, str | None] = field(default_factory=dict)
    """Each plot the card has a place for: its PNG's SHA-256, or None where it was not drawn (no matplotlib)."""

    def drawn(self) -> dict[str, bool]:
        return {name: sha is not None for name, sha in self.plots.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"stats": self.stats, "card": self.card, "plots": self.plots}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CardResult":
        return cls(stats=d["stats"], card=bool(d["card"]), plots=dict(d.get("plots", {})))


def shard_tokens(plan: BuildPlan) -> dict[str, list[int]]:
    """The tokens of each split's shards, as the layout recorded them."""
    return {split: list(info.sizes) for split, info in read_layout(plan).splits.items()}


def parent_dir(plan: BuildPlan) -> Path | None:
    """The parent version's directory, for the card's comparison (None: no parent, or it went away)."""
    if not plan.parent:
        return None
    try:
        return Catalog(plan.catalog).resolve(plan.parent)
    except Exception:  # a parent that went away: the card just has no comparison
        return None


def _layout_manifest(plan: BuildPlan) -> Manifest:
    """The manifest as far as the layout knows it: no shard entries yet, everything the statistics need."""
    tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    return assemble_manifest(
        plan,
        layout=read_layout(plan),
        units=unit_results(plan),
        shards={},
        tokenizer=TokenizerInfo.of(tokenizer, rank_file=tokenizer_file_name(tokenizer)),
        created_at="",
    )


def _matches(out: Path, result: CardResult) -> bool:
    if result.stats is not None:
        for f in result.stats.get("files", []):
            path = out / f["file"]
            # Sizes only: the statistics files' SHA-256 are in the manifest, which validation checks.
            if not path.is_file() or path.stat().st_size != f["bytes"]:
                return False
    for name, sha in result.plots.items():
        path = out / CARD_DIR / name
        if sha is not None and (not path.is_file() or sha256_file(path) != sha):
            return False
    return True


def card_done(plan: BuildPlan | str | os.PathLike[str]) -> CardResult | None:
    """The stage's recorded result if ``out/`` still holds what it records, for today's settings; else None."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    try:
        result = CardResult.from_dict(json.loads(staging.card_file.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (result.stats is not None) != collecting(plan) or result.card != card_wanted(plan.config):
        return None  # drawn under other settings (BuildConfig.stats, .card): drawn again
    return result if _matches(staging.out, result) else None


def draw_card(plan: BuildPlan | str | os.PathLike[str]) -> CardResult:
    """Merge the statistics into ``out/`` and draw the card's plots (after the layout); idempotent."""
    plan = as_plan(plan)
    done = card_done(plan)
    if done is not None:
        return done
    staging = Staging(plan.staging)
    staging.card_file.unlink(missing_ok=True)
    out = staging.out
    out.mkdir(parents=True, exist_ok=True)
    stats = None
    plots: dict[str, str | None] = {}
    if collecting(plan):
        manifest = _layout_manifest(plan)
        tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
        stats = write_stats(plan, manifest, out, tokenizer, shard_tokens=shard_tokens(plan))
    card_dir = out / CARD_DIR
    if card_dir.exists():
        shutil.rmtree(card_dir)  # an earlier run's plots: drawn again, never mixed
    if stats is not None and card_wanted(plan.config):
        try:
            drawn = draw_plots(out, manifest.replace(extra={**manifest.extra, "stats": stats}),
                               parent=parent_dir(plan), parent_ref=plan.parent)
        except Exception as exc:  # the card is a view of stats.json; the data is fine without it
            log.warning("%s: the dataset card could not be drawn (%s)", card_dir, exc)
            shutil.rmtree(card_dir, ignore_errors=True)
            drawn = {}
        plots = {name: sha256_file(card_dir / name) if ok else None for name, ok in drawn.items()}
    result = CardResult(stats=stats, card=card_wanted(plan.config), plots=plots)
    atomic_write_text(staging.card_file, json.dumps(result.to_dict(), sort_keys=True))
    return result

