"""Shard layouts of the tests, written by hand: schema 3's whole-document cuts, and schema 2's cuts across documents.

Since manifest schema 3 a build never lets a document span two shards, but
versions of schemas 1 and 2 (still read, validated and served) do; the
readers' and the validator's handling of such a shard (a ``.bos.idx``
without entry 0, a Megatron ``.idx`` whose first sequence is a tail) is
tested on versions cut here by hand from a built one, as the code of schema 2
cut them, since no build writes them any more.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml

from shardflow.formats import bosidx, get_format
from shardflow.manifest import read_manifest


def whole_document_cuts(lengths: Iterable[int], bound: int) -> list[int]:
    """Schema 3's shard sizes, written from docs/FORMAT.md (never from the build's code).

    A shard takes documents, in order, while it stays within ``bound`` tokens;
    a document longer than ``bound`` is a shard of its own.
    """
    sizes: list[int] = []
    current = 0
    for n in lengths:
        if current and current + n > bound:
            sizes.append(current)
            current = 0
        current += int(n)
    if current:
        sizes.append(current)
    return sizes


def _entry(directory: Path, name: str) -> dict[str, Any]:
    data = (directory / name).read_bytes()
    return {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write(path: Path, data: bytes) -> None:
    # Unlink first: a built version's files may be hard links to its staged pieces.
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def cut_across_documents(directory: Path, split: str, shard_tokens: int) -> None:
    """Rewrite ``split`` of the version in ``directory`` as manifest schema 2 laid it out, in place.

    Every shard but the last holds exactly ``shard_tokens`` tokens, cut across
    documents; each shard's ``.bos.idx`` lists only the documents that start
    in it (a continued one has no entry) and the format's sidecars are written
    for those starts. The manifest is rewritten to match (``schema_version``
    2, without schema 3's ``inputs[].shards``): ``directory`` must be a copy
    that no catalog lists, opened by path.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    fmt = get_format(manifest.format_name)
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    old = manifest.splits[split].shards
    tokens, starts, offset = [], [], 0
    for entry in old:
        tokens.append(np.asarray(fmt.open(directory / entry.file, dtype)).copy())
        starts.append(bosidx.read(directory / entry.index.file, entry.tokens).astype(np.int64) + offset)
        offset += entry.tokens
    stream, all_starts = np.concatenate(tokens), np.concatenate(starts)
    for entry in old:
        for f in (entry.file, *(e.file for e in entry.files)):
            (directory / f).unlink()
    folder = Path(old[0].file).parent
    raw = yaml.safe_load((directory / "metadata.yaml").read_text())
    shards: list[dict[str, Any]] = []
    for k, lo in enumerate(range(0, len(stream), shard_tokens)):
        chunk = stream[lo : lo + shard_tokens].astype(dtype)
        inside = all_starts[(all_starts >= lo) & (all_starts < lo + len(chunk))] - lo
        name = (folder / f"{manifest.name}_{split}_{k:06d}.{fmt.extension}").as_posix()
        path = directory / name
        _write(path, fmt.header(len(chunk), dtype) + chunk.tobytes())
        index = bosidx.index_path(path)
        _write(index, bosidx.encode(inside, len(chunk)))
        shard = {**_entry(directory, name), "tokens": len(chunk), "documents": len(inside),
                 "index": _entry(directory, index.relative_to(directory).as_posix())}
        sidecars = fmt.sidecars(path, len(chunk), dtype, inside)
        for side, data in sidecars.items():
            _write(side, data)
        if sidecars:
            shard["sidecars"] = [_entry(directory, p.relative_to(directory).as_posix()) for p in sidecars]
        shards.append(shard)
    raw["schema_version"] = 2
    raw["splits"][split]["shards"] = shards
    every = [s for entry in raw["splits"].values() for s in entry["shards"]]
    raw["totals"]["shards"] = len(every)
    raw["totals"]["bytes"] = sum(s["bytes"] + s["index"]["bytes"] + sum(c["bytes"] for c in s.get("sidecars", ())) for s in every)
    raw["config"]["shard_tokens"] = shard_tokens
    for item in raw["inputs"]:
        item.pop("shards", None)
    (directory / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
