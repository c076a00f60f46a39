"""A published version of many small shards, made in seconds: what opening a version costs is measured on it.

``wide_version(root, shards)`` builds a real small version of ``SAMPLE`` (for a
manifest whose every top-level field a build wrote: tokenizer, format, inputs,
config, tools), then writes ``shards`` small shard files of its format beside
their ``.bos.idx`` (the formats' own ``header`` and ``bosidx.encode``; no
fsync per file, which a build's writer does), a manifest naming them with their
sizes and SHA-256 (in its YAML, or with ``table`` in a shard table beside it),
and publishes that directory into the same catalog with
``publish_out``, as a build does. The result is listed by the catalog, sealed
(read-only, the record of published stats written) and validates; its
statistics section is left out (statistics are optional), so ``shardflow
validate`` checks the shards and totals only.

Shard ``k`` holds ``tokens`` ids: ``docs`` documents, each a BOS and ids that
name the shard (``100 + k % 50000``), so a sample tells which shard it came from.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardflow.config import BuildConfig
from shardflow.formats import bosidx, get_format
from shardflow.manifest import FileEntry, ShardEntry, SplitEntry, read_manifest, write_manifest
from shardflow.pipeline import build, publish_out

from .paths import SAMPLE

__all__ = ["WideVersion", "wide_version"]


@dataclass(frozen=True)
class WideVersion:
    """A published wide version: ``ref`` (``NAME@v1``) in ``catalog``, its ``directory`` and shard count."""

    ref: str
    catalog: Path
    data_root: Path
    directory: Path
    shards: int


def _entry(directory: Path, name: str, data: bytes) -> FileEntry:
    (directory / name).write_bytes(data)
    return FileEntry(file=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def wide_version(
    root: Path, shards: int, *, tokens: int = 64, docs: int = 2, table: bool = False, name: str | None = None
) -> WideVersion:
    """Publish a version of ``shards`` shards of ``tokens`` ids (``docs`` documents each) under ``root``.

    ``table``: its manifest lists the shards in a shard table (schema 4), not in its YAML. ``root/manifests`` is
    the catalog, ``root/data`` the data root. Reused when ``root`` already holds it.
    """
    name = name or f"wide{shards}{'t' if table else ''}"
    catalog, data_root = root / "manifests", root / "data"
    directory = data_root / name / "v1"
    if (directory / "metadata.yaml").is_file():
        return WideVersion(f"{name}@v1", catalog, data_root, Path(os.path.realpath(directory)), shards)
    base = build(BuildConfig(name=f"{name}-base", sources=(str(SAMPLE),), shard_tokens=50_000, val_fraction=0.0),
                 data_root=data_root, catalog=catalog)
    manifest = read_manifest(Path(base.manifest_path))
    fmt = get_format(manifest.format_name)
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    bos = int(manifest.boundary["token_id"])
    out = data_root / f".{name}-out"
    (out / "train").mkdir(parents=True)
    starts = np.arange(docs, dtype=np.int64) * (tokens // docs)
    index = bosidx.encode(starts, tokens)
    index_sha = hashlib.sha256(index).hexdigest()
    header = fmt.header(tokens, dtype)
    entries = []
    for k in range(shards):
        ids = np.full(tokens, 100 + k % 50_000, dtype=dtype)
        ids[starts] = bos
        stem = f"train/{name}_train_{k:06d}"
        shard = _entry(out, f"{stem}.{fmt.extension}", header + ids.tobytes())
        (out / f"{stem}{bosidx.BOS_IDX_SUFFIX}").write_bytes(index)
        entries.append(ShardEntry(
            file=shard.file, bytes=shard.bytes, sha256=shard.sha256, tokens=tokens, documents=docs,
            index=FileEntry(file=f"{stem}{bosidx.BOS_IDX_SUFFIX}", bytes=len(index), sha256=index_sha),
        ))
    total_tokens, total_docs = shards * tokens, shards * docs
    nbytes = sum(e.bytes + e.index.bytes for e in entries)
    inputs = [{**manifest.inputs[0], "splits": {"train": {"first_token": 0, "tokens": total_tokens, "first_document": 0,
                                                           "documents": total_docs}},
               "shards": {"train": [0, shards]}}]
    build_key = hashlib.sha256(f"wide:{name}:{shards}:{tokens}:{docs}:{table}".encode()).hexdigest()
    wide = manifest.replace(
        name=name, build_key=build_key, config={**manifest.config, "name": name}, inputs=inputs,
        tokenized_info={**manifest.tokenized_info, "file_prefix": f"{name}_"},
        format={**manifest.format, "file_pattern": f"{{split}}/{name}_{{split}}_*.{fmt.extension}"},
        splits={"train": SplitEntry(documents=total_docs, tokens=total_tokens, shards=tuple(entries))},
        totals={**manifest.totals, "documents": total_docs, "tokens": total_tokens, "shards": shards, "bytes": nbytes},
        extra={k: v for k, v in manifest.extra.items() if k != "stats"},
    )
    write_manifest(out, wide, shard_table=table)
    ref = publish_out(out, name=name, build_key=build_key, data_root=data_root, catalog=catalog)
    return WideVersion(ref, catalog, data_root, Path(os.path.realpath(data_root / name / ref.partition("@")[2])), shards)
