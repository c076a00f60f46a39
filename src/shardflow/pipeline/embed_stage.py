"""Embedding versions: the build's embedding stages, and adding embeddings to a published version.

A build with ``--embed`` runs, after its shards are written and validated and
before ``finalize``, three stages (``stages.py``)::

    embed-fit    one job, with --embed-dim only: embed the PCA's fixed sample, fit it, write its
                 mean and components into out/embeddings/     -> layout/embed-pca.json (EmbedFit)
    embed-shard  one job per shard: its documents, decoded from its own files (its record alone is
                 read), embedded, projected, encoded into its own files   -> layout/SPLIT-K.embed.json
                 (a shard an incremental build linked from its parent: the parent's files of it, linked)
    embed        one job: the parts' records as the manifest's sections   -> embed.json (EmbedResult)

Each job first looks for its committed record (and its files in ``out/`` with
the recorded sizes) and returns it; a job killed midway left only temporary
files, and runs again. ``finalize`` puts ``embed.json``'s sections into the
one manifest it writes and validates. ``embed_version`` makes a new version of
a published one: same token shards (hard-linked), plus embeddings computed by
the same functions (``shardflow.embed.compute``), with the published version as
its parent.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_text
from ..config import EmbedOptions
from ..embed.embedder import Embedder
from ..embed.compute import (check_embed_options, embed_part, embeddings_info, fit_projection, pca_fit_split,
                             shard_texts, split_section)
from ..embed.files import embedding_parts, part_file_names, projection_from_section
from ..embed.models import MODELS
from ..errors import ConfigError
from ..formats import get_format
from ..manifest import version_file
from ..reader import Version
from ..shardset import ShardInfo, ShardSet
from ..tokenizers import load_reference_tokenizer, load_tokenizer
from .check import shard_context
from .incremental import open_parent
from .layout import read_layout
from .model import BuildPlan, EmbedFit, EmbedResult, EmbedShardResult
from .staged import staged_manifest
from .staging import Staging, as_plan
from .write import link_or_copy, shard_done, write_tokenizer_files

log = logging.getLogger("shardflow.pipeline")

__all__ = ["embed_fit", "fit_done", "embed_shard", "embed_shard_done", "embed_staged"]

_RUN_THEM = "(build() and the Prefect flow do)"


def _fit_record(staging: Staging) -> Path:
    return staging.layout_dir / "embed-pca.json"


def _shard_record(staging: Staging, split: str, k: int) -> Path:
    return staging.layout_dir / f"{split}-{k:06d}.embed.json"


def _in_place(out: Path, entries: list[dict[str, Any] | None]) -> bool:
    """Whether every file the entries (``{file, bytes}``; None skipped) name is in ``out/`` with its size."""
    try:
        return all((out / e["file"]).stat().st_size == e["bytes"] for e in entries if e)
    except OSError:
        return False


def _options(plan: BuildPlan) -> EmbedOptions:
    if plan.config.embed is None:
        raise ConfigError(f"{plan.staging}: this build has no embedding stage (its config has no embed options)")
    return plan.config.embed


def fit_done(plan: BuildPlan | str | os.PathLike[str]) -> EmbedFit | None:
    """The committed PCA fit when its files are in place, else None."""
    staging = Staging(as_plan(plan).staging)
    try:
        done = EmbedFit(pca=json.loads(_fit_record(staging).read_text())["pca"])
    except FileNotFoundError:
        return None
    return done if _in_place(staging.out, [done.pca["mean"], done.pca["components"]]) else None


def embed_fit(plan: BuildPlan | str | os.PathLike[str]) -> EmbedFit:
    """The embed-fit stage (``--embed-dim``): embed the fit sample, fit the PCA, write its files; idempotent.

    The sample is a fixed stride over the train split's documents, so the fit
    (and its files) is the same whatever the number of workers or shards' order.
    """
    plan = as_plan(plan)
    options = _options(plan)
    if options.embed_dim is None:
        raise ConfigError(f"{plan.staging}: embed-fit applies to a PCA (embed_dim), which this build does not ask for")
    done = fit_done(plan)
    if done is not None:
        return done
    staging = Staging(plan.staging)
    # The sample's texts are decoded through the staged version (its tokenizer file the one the version carries).
    write_tokenizer_files(load_tokenizer(plan.config.tokenizer, backend=plan.config.backend), staging.out)
    manifest = staged_manifest(plan, embeddings=False)
    check_embed_options(manifest, options)
    split = pca_fit_split(manifest)
    _, pca = fit_projection(
        staging.out, manifest.name, options, split=split, documents=manifest.splits[split].documents,
        texts=Version(staging.out, manifest).split(split).text, embedder=Embedder(config=options),
    )
    atomic_write_text(_fit_record(staging), json.dumps({"pca": pca}))  # the stage's commit point
    return EmbedFit(pca=pca)


def _recorded_shard(staging: Staging, split: str, k: int) -> EmbedShardResult | None:
    try:
        done = EmbedShardResult.from_dict(json.loads(_shard_record(staging, split, k).read_text()))
    except FileNotFoundError:
        return None
    return done if _in_place(staging.out, [done.part, done.part.get("scales")]) else None


def embed_shard_done(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> EmbedShardResult | None:
    """Shard ``k`` of ``split``'s committed embeddings when their files are in place, else None."""
    return _recorded_shard(Staging(as_plan(plan).staging), split, k)


def _staged_shard(plan: BuildPlan, split: str, k: int) -> ShardSet:
    """Written shard ``k`` of ``split`` alone, as a one-shard set: from its own record and the plan (O(1) reads)."""
    written = shard_done(plan, split, k)
    if written is None:
        raise ConfigError(
            f"{plan.staging}: shard {k} of split {split!r} is not written; run write_shard for it first {_RUN_THEM}"
        )
    out, entry, ctx = Staging(plan.staging).out, written.entry, shard_context(plan, split, k)
    return ShardSet(
        name=f"{plan.config.name} (staged)",
        shards=[ShardInfo(path=out / entry.file, tokens=entry.tokens, index=out / entry.index.file, entry=entry)],
        fmt=get_format(ctx.format_name),
        dtype=np.dtype(ctx.dtype).newbyteorder("<"),
        placement=ctx.placement,  # type: ignore[arg-type]
        boundary_token=ctx.boundary,
        tokenizer=plan.config.tokenizer,
        vocab_size=ctx.vocab_size,
        fingerprint=f"{plan.build_key}:{split}:{k}",
        directory=out,
    )


# What made a parent's embeddings, compared with what would make ours: where it ran is no property of the data.
_NOT_THE_MODEL = ("device",)


def _parent_part(plan: BuildPlan, staging: Staging, split: str, k: int, options: EmbedOptions) -> EmbedShardResult | None:
    """Shard ``k``'s embeddings hard-linked from the parent version, when the shard is the parent's (an unchanged
    input of an incremental build) and the parent embedded it per shard with the same model and options; else None.

    Without a PCA only: a projection is fitted on each version's own sample. The files are checked by size, as
    the linked shard is (``incremental.parent_problem``); finalize's validation hashes them with the version's.
    """
    if plan.reuse is None or options.embed_dim is not None:
        return None  # (a build without a parent reads no layout here)
    sources = read_layout(plan).splits[split].sources
    if sources is None or sources[k][0] >= 0:
        return None
    parent = open_parent(plan.reuse)
    info = parent.manifest.extra.get("embeddings") or {}
    section = parent.manifest.splits[split].extra.get("embeddings") or {}
    ours = {key: v for key, v in Embedder(config=options).model_info().items() if key not in _NOT_THE_MODEL}
    keys = options.key_fields()  # (not where or how fast: device, batch sizes)
    theirs = info.get("options") if isinstance(info.get("options"), dict) else {}
    if (info.get("pca") or {key: theirs.get(key) for key in keys} != keys or "parts" not in section
            or len(section["parts"]) != parent.splits[split].num_shards
            or any(info.get(key) != v for key, v in ours.items())):
        return None
    part = dict(section["parts"][sources[k][1]])
    names = part_file_names(plan.config.name, split, k)
    for entry, name in ((part, names[0]), (part.get("scales"), names[1])):
        if not entry:
            continue
        src = version_file(parent.directory, entry["file"], "an embedding file")
        if not src.is_file() or src.stat().st_size != entry["bytes"]:
            raise parent.damaged(src, f"not the {entry['bytes']} bytes its manifest lists")
        (staging.out / name).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(src, staging.out / name)
    part["file"] = names[0]
    if part.get("scales"):
        part["scales"] = {**part["scales"], "file": names[1]}
    return EmbedShardResult(split=split, index=k, part=part, tokens=0)


def embed_shard(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> EmbedShardResult:
    """The embed-shard stage: embed the documents of written shard ``k`` of ``split`` into their own files (or
    link the parent's, for a shard linked from it: ``_parent_part``); idempotent."""
    plan = as_plan(plan)
    options = _options(plan)
    staging = Staging(plan.staging)
    done = _recorded_shard(staging, split, k)
    if done is not None:
        return done
    linked = _parent_part(plan, staging, split, k, options)
    if linked is not None:
        atomic_write_text(_shard_record(staging, split, k), json.dumps(linked.to_dict()))  # the job's commit point
        return linked
    pca = _fitted_pca(plan)
    projection = projection_from_section(staging.out, pca) if pca is not None else None
    rows, texts = shard_texts(_staged_shard(plan, split, k), 0, load_reference_tokenizer(plan.config.tokenizer).decode)
    part, tokens = embed_part(
        staging.out, part_file_names(plan.config.name, split, k), options, rows=rows, texts=texts,
        embedder=Embedder(config=options), projection=projection,
    )
    result = EmbedShardResult(split=split, index=k, part=part, tokens=tokens)
    atomic_write_text(_shard_record(staging, split, k), json.dumps(result.to_dict()))  # the job's commit point
    return result


def _fitted_pca(plan: BuildPlan) -> dict[str, Any] | None:
    """The PCA embed-fit recorded (None without ``embed_dim``); an error naming the stage if it has not run."""
    if plan.config.embed is None or plan.config.embed.embed_dim is None:
        return None
    fit = fit_done(plan)
    if fit is None:
        raise ConfigError(f"{plan.staging}: the PCA is not fitted; run embed_fit first {_RUN_THEM}")
    return fit.pca


def _embed_result_done(staging: Staging) -> EmbedResult | None:
    if not staging.embed_file.exists():
        return None
    done = EmbedResult.from_dict(json.loads(staging.embed_file.read_text()))
    pca = done.info.get("pca") or {}
    files: list[dict[str, Any] | None] = [pca.get("mean"), pca.get("components")]
    for section in done.splits.values():
        files += [f for part in embedding_parts(section) for f in (part, part.get("scales"))]
    return done if _in_place(staging.out, files) else None


def embed_staged(plan: BuildPlan | str | os.PathLike[str]) -> EmbedResult | None:
    """The embed stage (``config.embed``; None without it): every shard's part as the manifest's sections; idempotent."""
    plan = as_plan(plan)
    options = plan.config.embed
    if options is None:
        return None
    staging = Staging(plan.staging)
    done = _embed_result_done(staging)
    if done is not None:
        return done
    pca = _fitted_pca(plan)
    layout = read_layout(plan)
    parts: dict[str, list[dict[str, Any]]] = {split: [] for split in layout.splits}
    for split, k in layout.shard_jobs():
        shard = _recorded_shard(staging, split, k)
        if shard is None:
            raise ConfigError(
                f"{plan.staging}: shard {k} of split {split!r} is not embedded; run embed_shard for it first {_RUN_THEM}"
            )
        parts[split].append(shard.part)
    dim = MODELS[options.model].dim if pca is None else int(pca["dim"])
    splits = {split: split_section(ps, options, dim=dim, pca=pca is not None) for split, ps in parts.items()}
    extra = 0 if pca is None else pca["mean"]["bytes"] + pca["components"]["bytes"]
    result = EmbedResult(
        info=embeddings_info(Embedder(config=options), options, pca),
        splits=splits,
        total_bytes=extra + sum(section["bytes"] for section in splits.values()),
    )
    atomic_write_text(staging.embed_file, json.dumps(result.to_dict()))  # the stage's commit point
    return result
