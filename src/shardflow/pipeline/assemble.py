"""Assembling a staged build's manifest from what the stages returned: no side effects.

``assemble_manifest`` is a pure function of the plan, the layout, the units'
and shards' results, the tokenizer's facts and (optionally) the embedding
stage's sections. ``publish`` later stamps only the version's identity
(``version``, ``dataset_path``) into it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ConfigError
from ..formats import bosidx, get_format
from ..manifest import SCHEMA_VERSION, Manifest, SplitEntry
from ..targets import file_pattern, get_target
from ..sources import InputFile
from ..tokenizers import Tokenizer
from .model import BuildPlan, EmbedResult, InputCounts, Layout, ShardResult, UnitResult

__all__ = ["TokenizerInfo", "assemble_manifest", "now"]


def now() -> str:
    """The current UTC time as the manifest records it (``2026-11-22T18:44:21Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _dist(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    """What the manifest records about the tokenizer a build used."""

    name: str
    vocab_size: int
    backend: str
    rank_file_sha256: str | None
    """The SHA-256 of the vocabulary file (every family's; tiktoken's may be a package's file)."""
    rank_file: str | None
    """The copy of the tokenizer file inside the version (its file name), if any."""
    boundary_token: str | None
    """The tokenizer's own classic boundary (``<|endoftext|>``), None if its files define none.

    It only decides the shape of the manifest's ``boundary`` section; the tokens
    themselves are the plan's ``Boundaries``, resolved once while planning.
    """
    boundary_id: int | None
    libraries: dict[str, str | None]
    family: str = "tiktoken"

    @classmethod
    def of(cls, tokenizer: Tokenizer, *, rank_file: str | None) -> "TokenizerInfo":
        try:
            classic: tuple[str | None, int | None] = (tokenizer.eot_token, tokenizer.eot_id)
        except ConfigError:
            # A bare tokenizer.json (no tokenizer_config.json): the user named the boundaries with
            # --bos-token/--eos-token and planning resolved them; only the section's shape needs this.
            classic = (None, None)
        return cls(
            name=tokenizer.name,
            vocab_size=tokenizer.vocab_size,
            backend=tokenizer.backend,
            rank_file_sha256=tokenizer.spec.rank_file_sha256,
            rank_file=rank_file,
            boundary_token=classic[0],
            boundary_id=classic[1],
            libraries=tokenizer.library_versions(),
            family=tokenizer.spec.family,
        )

    def file_fields(self) -> dict[str, Any]:
        """The ``tokenized_info`` entries naming the tokenizer file and its copy.

        tiktoken keeps the keys it always had (``rank_file_sha256``, and
        ``rank_file`` for a local copy): its manifests stay byte-identical.
        The file families record ``family``, ``tokenizer_file`` (the copy's
        name) and ``tokenizer_file_sha256``.
        """
        if self.family == "tiktoken":
            return {"rank_file_sha256": self.rank_file_sha256, **({"rank_file": self.rank_file} if self.rank_file else {})}
        return {"family": self.family, "tokenizer_file": self.rank_file, "tokenizer_file_sha256": self.rank_file_sha256}


def _boundary_section(plan: BuildPlan, tokenizer: TokenizerInfo) -> dict[str, Any]:
    """The ``boundary`` section: ``{token, token_id, placement}`` as always for one token at the classic
    boundary (``<|endoftext|>``); ``bos`` and ``eos`` added for ``both`` or another token."""
    if plan.boundaries is None:  # plan_build always resolves them (and fills them into an older plan.json)
        raise ConfigError(f"{plan.staging}: the plan records no boundary tokens; plan the build again (plan_build)")
    if tokenizer.boundary_token is None or tokenizer.boundary_id is None:
        return plan.boundaries.manifest_section(None)
    return plan.boundaries.manifest_section((tokenizer.boundary_token, tokenizer.boundary_id))


def _per_input(plan: BuildPlan, units: list[UnitResult]) -> list[InputCounts]:
    """Per input: its counts, from its work units or, for a reused input, from the parent version."""
    per_input = [InputCounts() for _ in plan.inputs]
    for r in units:
        i = plan.units[r.unit].input
        per_input[i] = per_input[i] + r.counts()
    if plan.reuse:
        for i, reused in plan.reuse.inputs.items():
            per_input[i] = reused.counts
    return per_input


def hashed_inputs(plan: BuildPlan, units: list[UnitResult]) -> list[InputFile]:
    """The plan's inputs with the SHA-256 of every object on object storage filled in.

    Planning identified such an object by its storage identity only (unless an
    earlier version recorded its hash); the worker that read its first unit
    hashed it (``UnitResult.input_sha256``), or, reused unchanged, the parent
    version recorded it.
    """
    out = list(plan.inputs)
    for n, inp in enumerate(out):
        if inp.sha256:
            continue
        hashed = [r.input_sha256 for r in units if plan.units[r.unit].input == n and r.input_sha256]
        if hashed:
            out[n] = dataclasses.replace(inp, sha256=hashed[0])
        elif plan.reuse and n in plan.reuse.inputs:
            out[n] = dataclasses.replace(inp, sha256=str(plan.reuse.inputs[n].entry.get("sha256", "")))
    return out


def assemble_manifest(
    plan: BuildPlan,
    *,
    layout: Layout,
    units: list[UnitResult],
    shards: dict[str, list[ShardResult]],
    tokenizer: TokenizerInfo,
    embeddings: EmbedResult | None = None,
    created_at: str,
    build_key: str | None = None,
) -> Manifest:
    """The manifest of a staged build (its version not yet assigned).

    ``build_key``: the key of the content (``staged.content_key``), when planning
    had to key objects on object storage by their storage identity; default the plan's.
    """
    cfg = plan.config
    fmt = get_format(cfg.format)
    splits = {
        split: SplitEntry(
            documents=info.documents,
            tokens=info.tokens,
            shards=tuple(r.entry for r in shards.get(split, [])),
            extra={} if embeddings is None else {"embeddings": embeddings.splits[split]},
        )
        for split, info in layout.splits.items()
    }
    counts = _per_input(plan, units)
    totals: dict[str, Any] = {
        "documents": sum(s.documents for s in splits.values()),
        "tokens": sum(s.tokens for s in splits.values()),
        "shards": sum(len(s.shards) for s in splits.values()),
        "bytes": sum(sh.bytes + sum(f.bytes for f in sh.files) for s in splits.values() for sh in s.shards),
        "input_rows": sum(c.rows for c in counts),
        "null_texts": sum(c.null_texts for c in counts),
        "empty_texts": sum(c.empty_texts for c in counts),
        "invalid_utf8": sum(c.invalid_utf8 for c in counts),
        "skipped_invalid_utf8": sum(c.skipped_invalid_utf8 for c in counts),
        "max_token_id": max(c.max_token_id for c in counts),
    }
    # bad_records only where records can be bad or are skipped: Parquet-only manifests stay as they were.
    shows_bad = [cfg.on_bad_record == "skip" or inp.kind == "jsonl" for inp in plan.inputs]
    if any(shows_bad):
        totals["bad_records"] = sum(c.bad_records for c in counts)
    entries = [counts[n].to_dict() for n in range(len(plan.inputs))]
    for entry, shown in zip(entries, shows_bad):
        if not shown:
            del entry["bad_records"]
    extra: dict[str, Any] = {}
    if plan.reuse:
        reused = plan.reuse.inputs
        extra["reuse"] = {
            "parent": plan.reuse.parent,
            "reused_inputs": [plan.inputs[i].relname for i in sorted(reused)],
            "tokenized_inputs": [inp.relname for n, inp in enumerate(plan.inputs) if n not in reused],
            "linked_shards": sum(1 for results in shards.values() for r in results if r.linked),
        }
    if cfg.target is not None:  # which trainer's reader the version was laid out for (also in config)
        extra["target"] = {"name": cfg.target, "stack": get_target(cfg.target).stack}
    if embeddings is not None:
        totals["embedding_bytes"] = embeddings.total_bytes
        extra["embeddings"] = embeddings.info
    return Manifest(
        schema_version=SCHEMA_VERSION,
        name=cfg.name,
        version="",
        description=cfg.description,
        dataset_path="",
        data_content="text",
        content_field=cfg.text_column,
        tokenized_info={
            "tokenizer": tokenizer.name,
            "file_prefix": f"{cfg.name}_",
            "dtype": plan.dtype,
            "file_extension": fmt.extension,
            "vocab_size": tokenizer.vocab_size,
            "backend": tokenizer.backend,
            **tokenizer.file_fields(),
        },
        parent_datasets=[],
        format={
            "name": fmt.name,
            "header_magic": fmt.header_magic,
            "header_bytes": len(fmt.header(0, np.dtype(plan.dtype))),
            "file_pattern": file_pattern(cfg.target, cfg.name, fmt.extension),
            "index_suffix": bosidx.BOS_IDX_SUFFIX,
        },
        boundary=_boundary_section(plan, tokenizer),
        splits=splits,
        totals=totals,
        inputs=[
            {
                **{k: v for k, v in inp.to_dict().items() if k != "stat"},  # (the plan's, this machine's)
                **entries[n],
                "splits": {s: r.to_dict() for s, r in layout.inputs[n].items()},
                # The placed splits' shards that hold this input's documents and no other's (schema 3):
                # what an incremental build links for it when the input is unchanged.
                "shards": {s: list(r) for s, r in layout.input_shards[n].items()},
            }
            for n, inp in enumerate(hashed_inputs(plan, units))
        ],
        config=cfg.to_dict(),
        tools={
            "shardflow": __version__,
            **tokenizer.libraries,
            "numpy": np.__version__,
            "pyarrow": _dist("pyarrow"),
            "python": platform.python_version(),
        },
        build_key=build_key or plan.build_key,
        created_at=created_at,
        parent=plan.parent,
        extra=extra,
    )
