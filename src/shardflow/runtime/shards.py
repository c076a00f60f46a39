"""Where a dataset's tokens are: the ordered shards of one split, opened by reference.

``open_shards`` turns any of these into a ``ShardSet``:

* ``NAME@VERSION``, ``NAME@latest``, ``NAME``, a version directory or its
  ``metadata.yaml`` -- resolved through the catalog and opened with
  ``shardflow.reader.open_version``, which checks the manifest schema and that
  every file exists with the size the manifest gives (``verify=True`` also
  checks every checksum). The token counts come from the manifest, so opening
  reads no shard data, whatever the number of shards;
* a plain directory of shards without a manifest (or a glob of shard files),
  KempnerForge / modded-nanogpt style. The dtype is taken from each file's
  nanogpt or ``.npy`` header; a headerless ``.bin`` shard needs ``dtype=``.
  It is never guessed from the file size.

A ``ShardSet`` opens each shard's memory map on first use and keeps it; the
maps are never pickled (a copy sent to a DataLoader worker reopens them), so
passing a dataset to workers costs nothing whatever its size.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..catalog import Catalog
from ..errors import ConfigError, ValidationError
from ..formats import FORMATS, NANOGPT, NANOGPT_LEGACY, NPY, RAWBIN, ShardFormat, bosidx, get_format
from ..formats.base import TOKEN_DTYPES
from ..manifest import MANIFEST_NAME
from ..reader import open_version

__all__ = ["ShardInfo", "ShardSet", "open_shards", "SHARD_EXTENSIONS"]

SHARD_EXTENSIONS = (".bin", ".npy")
"""File extensions a plain directory's shards may have (``.bos.idx`` sidecars are not shards)."""

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard: its file, its token count and its ``.bos.idx`` (None when it has none)."""

    path: Path
    tokens: int
    index: Path | None


class ShardSet:
    """The ordered shards of one split, their format and dtype, and where documents start.

    Built by ``open_shards``. ``shard(k)`` is shard ``k``'s tokens as a read-only
    array over a memory map; ``doc_starts(k)`` the document starts within it.
    """

    def __init__(
        self,
        *,
        name: str,
        shards: list[ShardInfo],
        fmt: ShardFormat,
        dtype: np.dtype,
        placement: Literal["bos", "eos"],
        boundary_token: int | None,
        tokenizer: str | None,
        vocab_size: int | None,
        fingerprint: str,
        directory: Path,
        version: Any | None = None,
    ) -> None:
        self.name = name
        """The reference as given (``NAME@vN`` for versions), for messages."""
        self.shards = shards
        self.format = fmt
        self.dtype = np.dtype(dtype)
        self.placement = placement
        """Where the boundary token sits: before (``bos``) or after (``eos``) each document."""
        self.boundary_token = boundary_token
        self.tokenizer = tokenizer
        """The tokenizer's name where the manifest records it (None for plain directories)."""
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        """Identifies exactly these shards (build key or file names and sizes); saved in resume states."""
        self.directory = directory
        self.version = version
        """The ``shardflow.reader.Version`` for manifest-backed sets, else None."""
        self.tokens = np.array([s.tokens for s in shards], dtype=np.int64)
        """Token count of every shard."""
        self._views: list[np.ndarray | None] = [None] * len(shards)
        self._starts: list[np.ndarray | None] = [None] * len(shards)

    # Memory maps and cached indexes stay out of pickles: a DataLoader worker
    # (spawn / forkserver) gets the small description and reopens what it uses.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_views"] = [None] * len(self.shards)
        state["_starts"] = [None] * len(self.shards)
        state["version"] = None
        return state

    def __repr__(self) -> str:
        return f"ShardSet({self.name!r}, shards={self.num_shards}, tokens={self.num_tokens}, dtype={self.dtype.name})"

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.sum())

    def shard(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens: a read-only array over its memory map (header and size checked once)."""
        view = self._views[k]
        if view is None:
            info = self.shards[k]
            mm = self.format.open(info.path, self.dtype)
            if len(mm) != info.tokens:
                raise ValidationError(f"{info.path}: {len(mm)} tokens, but {info.tokens} were expected when it was opened")
            # A base-class view slices several times faster than np.memmap (no
            # subclass bookkeeping per slice); it keeps the map alive through .base.
            view = mm.view(np.ndarray)
            self._views[k] = view
        return view

    def has_index(self, k: int) -> bool:
        return self.shards[k].index is not None or self.boundary_token is not None

    def doc_starts(self, k: int, *, cache: bool = True) -> np.ndarray:
        """Document starts in shard ``k`` (int32 token indices, ascending), from its ``.bos.idx``.

        A document continued from the previous shard has no entry. Plain
        directories without sidecars derive them from ``boundary_token`` (one
        vectorized pass over the shard, once); without either this raises.
        Kept as int32, as on disk (shards hold fewer than 2**31 tokens), and
        cached unless ``cache=False``.
        """
        starts = self._starts[k]
        if starts is None:
            info = self.shards[k]
            if info.index is not None:
                starts = bosidx.read(info.index, info.tokens)
                self._check_index(k, starts)
            elif self.boundary_token is not None:
                starts = self._derive_starts(k).astype(np.int32)
            else:
                raise ConfigError(
                    f"{info.path}: no {bosidx.BOS_IDX_SUFFIX} sidecar, so document starts are unknown; packing and "
                    "BOS alignment need them. Pass boundary_token=ID (and boundary='bos' or 'eos') to derive them"
                )
            if cache:
                self._starts[k] = starts
        return starts

    def _check_index(self, k: int, starts: np.ndarray) -> None:
        # Plain directories may hold sidecars written by other tools (NeMo's hold
        # byte offsets, not token indices). Where the boundary token is known,
        # check that the index points at it rather than trust it.
        if self.version is not None or self.boundary_token is None or not len(starts):
            return
        toks = self.shard(k)
        starts = starts.astype(np.int64)
        if self.placement == "bos":
            ok = bool(np.all(toks[starts] == self.boundary_token))
        else:
            inner = starts[starts > 0]
            ok = bool(np.all(toks[inner - 1] == self.boundary_token))
        if not ok:
            raise ValidationError(
                f"{self.shards[k].index}: its entries do not point at document starts (token {self.boundary_token} "
                f"{'at' if self.placement == 'bos' else 'just before'} each entry); it is not a shardflow "
                ".bos.idx of token indices. Delete it or pass the right boundary_token"
            )

    def _derive_starts(self, k: int) -> np.ndarray:
        toks = self.shard(k)
        hits = np.flatnonzero(toks == self.boundary_token).astype(np.int64)
        if self.placement == "bos":
            return hits
        starts = hits + 1
        starts = starts[starts < len(toks)]
        # Shard k starts a document iff it is the first shard or the previous one ends with EOS.
        prev_ends = k == 0 or (self.shards[k - 1].tokens > 0 and int(self.shard(k - 1)[-1]) == self.boundary_token)
        if prev_ends and len(toks):
            starts = np.concatenate(([0], starts))
        return starts


def _fingerprint(items: Any) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _looks_like_version(path: Path) -> bool:
    return (path.name == MANIFEST_NAME and path.is_file()) or (path.is_dir() and (path / MANIFEST_NAME).is_file())


def open_shards(
    ref: "str | os.PathLike[str] | ShardSet",
    *,
    split: str = "train",
    catalog: Catalog | str | os.PathLike[str] | None = None,
    verify: bool = False,
    dtype: str | np.dtype | None = None,
    format: str | None = None,
    pattern: str | None = None,
    boundary_token: int | None = None,
    boundary: Literal["bos", "eos"] | None = None,
) -> ShardSet:
    """The shards of ``split`` of a version reference, or of a plain directory / glob of shards.

    ``catalog=None`` means ``$SHARDFLOW_CATALOG`` or ``./manifests``. The
    options ``dtype``, ``format``, ``pattern``, ``boundary_token`` and
    ``boundary`` are for plain directories only: a version's manifest records them.
    """
    if isinstance(ref, ShardSet):
        return ref
    ref_str = os.fspath(ref)
    path = Path(ref_str).expanduser()
    plain_opts = {"dtype": dtype, "format": format, "pattern": pattern, "boundary_token": boundary_token, "boundary": boundary}
    if _looks_like_version(path) or not (path.is_dir() or _GLOB_CHARS & set(ref_str) or path.is_file()):
        given = [k for k, v in plain_opts.items() if v is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for plain directories of shards; "
                f"{ref_str} is a published version whose manifest records them"
            )
        return _open_version_split(ref_str, split=split, catalog=catalog, verify=verify)
    if verify:
        raise ConfigError(f"verify=True checks checksums against a manifest; {ref_str} is a plain directory without one")
    return _open_plain(
        path,
        ref_str,
        split=split,
        dtype=dtype,
        fmt_name=format,
        pattern=pattern,
        boundary_token=boundary_token,
        placement=boundary or "bos",
    )


def _open_version_split(
    ref: str, *, split: str, catalog: Catalog | str | os.PathLike[str] | None, verify: bool
) -> ShardSet:
    version = open_version(ref, catalog=catalog, verify=verify)
    entry = version.split(split).entry  # KeyError names the splits there are
    m = version.manifest
    shards = [
        ShardInfo(path=version.directory / s.file, tokens=s.tokens, index=version.directory / s.index.file)
        for s in entry.shards
    ]
    return ShardSet(
        name=m.ref,
        shards=shards,
        fmt=get_format(m.format_name),
        dtype=version.dtype,
        placement=m.boundary["placement"],
        boundary_token=int(m.boundary["token_id"]),
        tokenizer=str(m.tokenized_info.get("tokenizer")) if m.tokenized_info.get("tokenizer") else None,
        vocab_size=int(m.tokenized_info["vocab_size"]),
        fingerprint=_fingerprint({"build_key": m.build_key, "ref": m.ref, "split": split}),
        directory=version.directory,
        version=version,
    )


def _detect_format(path: Path) -> ShardFormat:
    """The format a file's header says: npy by extension, nanogpt(-legacy) by magic, else headerless bin."""
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
    return RAWBIN


def _open_plain(
    path: Path,
    ref: str,
    *,
    split: str,
    dtype: str | np.dtype | None,
    fmt_name: str | None,
    pattern: str | None,
    boundary_token: int | None,
    placement: str,
) -> ShardSet:
    if placement not in ("bos", "eos"):
        raise ConfigError(f"boundary must be 'bos' or 'eos', not {placement!r}")
    if boundary_token is not None and (isinstance(boundary_token, bool) or not isinstance(boundary_token, (int, np.integer))):
        raise ConfigError(f"boundary_token must be a token id (an int), not {boundary_token!r}")
    want_dtype = None
    if dtype is not None:
        try:
            want_dtype = np.dtype(dtype).newbyteorder("<")
        except TypeError:
            raise ConfigError(f"dtype {dtype!r} is not a NumPy dtype; use 'uint16' or 'uint32'") from None
        if want_dtype not in TOKEN_DTYPES.values():
            raise ConfigError(f"dtype must be uint16 or uint32, not {np.dtype(dtype)}")
    if fmt_name is not None and fmt_name not in FORMATS:
        raise ConfigError(f"unknown shard format {fmt_name!r}; use one of {', '.join(FORMATS)}")
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
    fingerprint = _fingerprint(
        {"files": [[s.path.name, s.path.stat().st_size] for s in shards], "format": fmt.name, "dtype": found_dtype.name}
    )
    return ShardSet(
        name=ref,
        shards=shards,
        fmt=fmt,
        dtype=found_dtype,
        placement=placement,  # type: ignore[arg-type]
        boundary_token=int(boundary_token) if boundary_token is not None else None,
        tokenizer=None,
        vocab_size=None,
        fingerprint=fingerprint,
        directory=directory,
    )
