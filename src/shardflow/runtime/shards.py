"""Where a dataset's tokens are: the ordered shards of one split, opened by reference.

``open_shards`` turns a reference (``NAME@VERSION``, a version directory or its
``metadata.yaml``, resolved through the catalog and opened with
``shardflow.reader.open_version``), a version on object storage (its URL, or
``NAME@VERSION`` in a catalog URL: a ``RemoteShardSet`` of
``shardflow.runtime.remote``, read through the verified local cache) or a plain
directory or glob of shards without a manifest into a ``ShardSet``; what each
accepts and how a plain directory's dtype is found: docs/RUNTIME.md ("Opening").

A ``ShardSet`` (defined in ``shardflow.shardset``, re-exported here) opens
each shard's memory map on first use and keeps it; the maps are never pickled
(a copy sent to a DataLoader worker reopens them), so passing a dataset to
workers costs nothing whatever its size.
"""

from __future__ import annotations

import glob as _glob
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import is_catalog_ref
from ..errors import ConfigError
from ..formats import MEGATRON, NANOGPT, NANOGPT_LEGACY, NPY, RAWBIN, ShardFormat, bosidx, get_format, megatron
from ..manifest import MANIFEST_NAME
from ..reader import open_version
from ..shardset import ShardInfo, ShardSet, fingerprint
from .options import REMOTE_OPTIONS, ReadOptions
from .remote import is_remote_ref, open_remote_split

__all__ = ["ShardInfo", "ShardSet", "open_shards", "SHARD_EXTENSIONS"]

SHARD_EXTENSIONS = (".bin", ".npy")
"""File extensions a plain directory's shards may have (``.bos.idx`` sidecars are not shards)."""

_GLOB_CHARS = frozenset("*?[")


def _looks_like_version(path: Path) -> bool:
    return (path.name == MANIFEST_NAME and path.is_file()) or (path.is_dir() and (path / MANIFEST_NAME).is_file())


def open_shards(ref: "str | os.PathLike[str] | ShardSet", *, options: ReadOptions | None = None, **kwargs: Any) -> ShardSet:
    """The shards of ``split`` of a version reference, or of a plain directory / glob of shards.

    The options are keywords or ``options=ReadOptions(...)``: ``split``,
    ``catalog`` (None means ``$SHARDFLOW_CATALOG`` or ``./manifests``),
    ``verify``, and for plain directories only (a version's manifest records
    them) ``dtype``, ``format``, ``pattern``, ``boundary_token`` and ``boundary``.

    A version on object storage (a version URL ``s3://bucket/data/NAME/vN``, or
    ``NAME@VERSION`` / ``NAME@latest`` with ``catalog="s3://bucket/catalog"``)
    gives a ``RemoteShardSet`` (``shardflow.runtime.remote``): opening reads its
    manifest (checked against the catalog's entry) and nothing else; each shard
    is fetched into ``cache_dir`` (else ``$SHARDFLOW_CACHE``, else
    ``~/.cache/shardflow``) and verified against the manifest's SHA-256 when it
    is first read. ``verify=True`` rehashes each cached file once per process.
    A missing dataset, version or object raises one ``ShardflowError`` naming it.
    """
    opts = ReadOptions.collect("open_shards", REMOTE_OPTIONS, options, kwargs)
    if isinstance(ref, ShardSet):
        return ref
    ref_str = os.fspath(ref)
    path = Path(ref_str).expanduser()
    remote = is_remote_ref(ref, opts.catalog)
    if not remote and opts.cache_dir is not None:
        raise ConfigError(f"cache_dir is for versions on object storage (s3://...); {ref_str!r} is read in place")
    # NAME@REF is the catalog's, never a folder of that name (``./NAME@REF`` is the folder).
    if remote or is_catalog_ref(ref) or _looks_like_version(path) or not (
            path.is_dir() or _GLOB_CHARS & set(ref_str) or path.is_file()):
        given = opts.plain_given()
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for plain directories of shards; "
                f"{ref_str} is a published version whose manifest records them"
            )
        if remote:  # the manifest now, each shard (fetched and verified into the cache) when first read
            return open_remote_split(ref_str, options=opts)
        # The version's own shard set (ShardSet.from_manifest): the reader and the
        # runtime share one cache of maps and indexes. A KeyError names the splits.
        return open_version(ref_str, catalog=opts.catalog, verify=opts.verify).split(opts.split).shards
    if opts.verify:
        raise ConfigError(f"verify=True checks checksums against a manifest; {ref_str} is a plain directory without one")
    return _open_plain(path, ref_str, opts)


def _detect_format(path: Path) -> ShardFormat:
    """The format a file's header says: npy by extension, nanogpt(-legacy) by magic, megatron by a sibling
    ``.idx`` with Megatron's magic (whose dtype code gives the dtype), else headerless bin."""
    if path.suffix == ".npy":
        return NPY
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) == 4:
        magic = int(np.frombuffer(head, dtype="<i4")[0])
        if magic == NANOGPT.header_magic:
            return NANOGPT
        if magic == NANOGPT_LEGACY.header_magic:
            return NANOGPT_LEGACY
    if megatron.is_megatron_idx(megatron.idx_path(path)):
        return MEGATRON
    return RAWBIN


def _open_plain(path: Path, ref: str, opts: ReadOptions) -> ShardSet:
    # The options' values were checked by ReadOptions; dtype is a little-endian token dtype there.
    split, want_dtype, fmt_name, pattern = opts.split, opts.dtype, opts.format, opts.pattern
    if path.is_dir():
        pat = (pattern if pattern is not None else "*{split}*").replace("{split}", split)
        candidates = sorted(path.glob(pat))
        where = f"{path} (pattern {pat!r})"
        directory = path
    else:
        if pattern is not None:
            raise ConfigError("pattern applies to a directory; the reference is already a file or a glob")
        candidates = sorted(Path(p) for p in _glob.glob(str(path)))
        where = ref
        directory = path.parent
    # A version directory also holds embeddings (<name>_<split>.emb.npy, ...): .npy, but not shards.
    files = [
        p
        for p in candidates
        if p.is_file()
        and p.suffix in SHARD_EXTENSIONS
        and not p.name.endswith(bosidx.BOS_IDX_SUFFIX)
        and ".emb." not in p.name
    ]
    if not files:
        hint = " Pass pattern='*' (or another glob) to choose the files." if path.is_dir() and pattern is None else ""
        raise ConfigError(f"no shard files ({', '.join(SHARD_EXTENSIONS)}) match {where}.{hint}")
    shards: list[ShardInfo] = []
    fmt: ShardFormat | None = None
    found_dtype: np.dtype | None = None
    for f in files:
        this_fmt = get_format(fmt_name) if fmt_name is not None else _detect_format(f)
        if this_fmt is RAWBIN and want_dtype is None:
            raise ConfigError(
                f"{f}: a headerless .bin shard (no nanogpt header) does not record its dtype; pass dtype='uint16' "
                "or dtype='uint32'. shardflow never guesses a dtype from the file size"
            )
        _, ntokens, dt = this_fmt.read_header(f, want_dtype)
        if fmt is not None and this_fmt is not fmt:
            raise ConfigError(f"{f} is a {this_fmt.name} shard but {shards[0].path} is {fmt.name}; one directory, one format")
        if found_dtype is not None and dt != found_dtype:
            raise ConfigError(f"{f} holds {dt} tokens but {shards[0].path} holds {found_dtype}; one directory, one dtype")
        fmt, found_dtype = this_fmt, dt
        idx = bosidx.index_path(f)
        shards.append(ShardInfo(path=f, tokens=ntokens, index=idx if idx.is_file() else None))
    assert fmt is not None and found_dtype is not None
    # The file names and sizes, hashed as a version's build key is: resume states hold it.
    identity = {"files": [[s.path.name, s.path.stat().st_size] for s in shards], "format": fmt.name, "dtype": found_dtype.name}
    return ShardSet(
        name=ref,
        shards=shards,
        fmt=fmt,
        dtype=found_dtype,
        placement=opts.boundary or "bos",
        boundary_token=opts.boundary_token,
        tokenizer=None,
        vocab_size=None,
        fingerprint=fingerprint(identity),
        directory=directory,
    )
