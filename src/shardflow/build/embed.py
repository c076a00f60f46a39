"""Embedding versions: the build's optional embedding stage, and adding embeddings to a published version.

``embed_staged`` runs after the shards are written and before ``finalize``:
it decodes every document from the staged shards, writes the embedding files
into ``out/`` and records the manifest sections they need in ``embed.json``
(its commit point); ``finalize`` puts those sections into the one manifest it
writes and validates. ``embed_version`` makes a new version of a published
one: same token shards (hard-linked), plus embeddings, with the published
version as its parent.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from .._io import atomic_write_text
from ..card import card_wanted, write_card
from ..catalog import Catalog, default_catalog
from ..config import EmbedOptions
from ..embedding_files import embedding_key, validate_embeddings
from ..embeddings import add_embeddings, check_embed_options
from ..errors import ValidationError
from ..manifest import SCHEMA_VERSION, SplitEntry, read_manifest, write_manifest
from ..tokenizers import load_tokenizer
from .manifest import now
from .model import BuildPlan, BuildResult, EmbedResult
from .publish import publish_out, staged_manifest
from .staging import Staging, as_plan
from .write import write_tokenizer_files

log = logging.getLogger("shardflow.build")

__all__ = ["embed_staged", "embed_version"]


def _files_in_place(out: Path, result: EmbedResult) -> bool:
    files = [section for section in result.splits.values()]
    files += [s["scales"] for s in result.splits.values() if s.get("scales")]
    pca = result.info.get("pca") or {}
    files += [pca[part] for part in ("mean", "components") if part in pca]
    try:
        return all((out / f["file"]).stat().st_size == f["bytes"] for f in files)
    except OSError:
        return False


def embed_staged(plan: BuildPlan | str | os.PathLike[str]) -> EmbedResult | None:
    """The embedding stage of a build (``config.embed``; None without it): embed every split; idempotent."""
    plan = as_plan(plan)
    options = plan.config.embed
    if options is None:
        return None
    staging = Staging(plan.staging)
    if staging.embed_file.exists():
        done = EmbedResult.from_dict(json.loads(staging.embed_file.read_text()))
        if _files_in_place(staging.out, done):
            return done
    # The texts are decoded from the staged shards, with the tokenizer file the version will carry.
    write_tokenizer_files(load_tokenizer(plan.config.tokenizer, backend=plan.config.backend), staging.out)
    manifest = add_embeddings(staging.out, staged_manifest(plan, embeddings=False), options)
    result = EmbedResult(
        info=manifest.extra["embeddings"],
        splits={split: entry.extra["embeddings"] for split, entry in manifest.splits.items()},
        total_bytes=int(manifest.totals["embedding_bytes"]),
    )
    atomic_write_text(staging.embed_file, json.dumps(result.to_dict()))  # the stage's commit point
    return result


def embed_version(
    ref: str,
    options: EmbedOptions,
    *,
    catalog: str | os.PathLike[str] | None = None,
    data_root: str | os.PathLike[str] | None = None,
) -> BuildResult:
    """Add embeddings to the published version ``ref`` as a new version whose parent is ``ref``.

    The token shards and indexes are hard-linked from the parent (no copies;
    a copy only where the data root is on another filesystem).
    """
    cat = Catalog(default_catalog(catalog))
    src_dir = cat.resolve(ref)
    parent = read_manifest(src_dir)
    check_embed_options(parent, options)  # before anything is staged
    key = embedding_key(parent.build_key, options)
    existing = cat.find_build(parent.name, key)
    if existing is not None:
        found = f"{parent.name}@{existing.version}"
        return BuildResult(ref=found, manifest_path=str(cat.version_dir(existing) / "metadata.yaml"), created=False)
    root = Path(data_root) if data_root is not None else src_dir.parent.parent
    staging = root / parent.name / ".staging" / f"emb-{key[:16]}"
    out = staging / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    names = [
        name
        for entry in parent.splits.values()
        for shard in entry.shards
        for name in (shard.file, *(f.file for f in shard.files))
    ]
    for field in ("rank_file", "tokenizer_file"):  # the tokenizer file's copy (tiktoken's key, the file families')
        if parent.tokenized_info.get(field):
            names.append(parent.tokenized_info[field])
    # The statistics describe the same tokens: linked too, so the manifest's ``stats`` section stays true.
    names += [f["file"] for f in parent.extra.get("stats", {}).get("files", [])]
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)  # a split directory (schema 2)
        try:
            os.link(src_dir / name, out / name)
        except OSError:
            shutil.copy2(src_dir / name, out / name)
    base = parent.replace(
        splits={k: SplitEntry(documents=v.documents, tokens=v.tokens, shards=v.shards, extra={}) for k, v in parent.splits.items()},
        extra={k: v for k, v in parent.extra.items() if k != "embeddings"},
        config={**parent.config, "embed": options.to_dict()},
        build_key=key,
        # The embeddings go into embeddings/, which schema 1 readers refuse; the shards stay the parent's,
        # so a schema-2 parent's (cut across inputs) keep schema 2, which no incremental build links from.
        schema_version=max(2, min(parent.schema_version, SCHEMA_VERSION)),
        created_at=now(),
        parent=parent.ref,
    )
    manifest = add_embeddings(out, base, options)
    problems = validate_embeddings(out, manifest)
    if problems:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValidationError("\n  ".join([f"embeddings of {ref} failed validation:", *problems]))
    write_manifest(out, manifest)
    if "stats" in manifest.extra and card_wanted(manifest.config):
        try:  # the card of the same tokens, against REF; a view, never a reason to fail
            write_card(out, manifest, parent=src_dir, parent_ref=ref)
        except Exception as exc:
            log.warning("%s: the dataset card could not be written (%s)", out / "card", exc)
    new_ref = publish_out(out, name=parent.name, build_key=key, data_root=root, catalog=cat.path, cleanup=staging)
    return BuildResult(ref=new_ref, manifest_path=str(cat.resolve(new_ref) / "metadata.yaml"), created=True)
