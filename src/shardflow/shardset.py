"""The on-disk layout of one split, read in one place: ordered shards, their offsets, document starts, memory maps.

A split is a sequence of shards; each holds a flat run of token ids (after any
header) and, beside it, a ``.bos.idx`` listing where documents start in it.
Concatenated in order, the shards form the split's token stream, in which a
document may cross a shard boundary. ``ShardSet`` is the one reader of that
layout, shared by ``shardflow.reader`` (documents and text),
``shardflow.runtime`` (training samples), validation and incremental builds:

    s = ShardSet.from_manifest(directory, manifest, "train")
    s.offsets               # int64 token offset of each shard, length shards + 1
    s.locate(123_456)       # (shard k, token index within shard k)
    s.read(1000, 3000)      # split-wide tokens, across shard boundaries
    s.doc_starts(k)         # document starts within shard k (its .bos.idx)
    s.all_doc_starts()      # every document start, split-wide (int64)

Constructing one reads no shard data: memory maps and indexes are opened on
first use and cached, and never pickled (a copy sent to another process
reopens what it uses). It needs numpy and PyYAML only, never pyarrow or a
tokenizer. Plain directories of shards without a manifest are opened by
``shardflow.runtime.open_shards``, into the same type.

A set that ``open_version`` made for a reader also holds the version's pin
(``shardflow.pins``: ``shardflow rm`` refuses the version while it lives) and
the stats its files were published with: a shard or index whose mtime is not
the recorded one when it is first mapped or read is hashed, and refused if its
bytes changed; a file gone because the version was removed says so.

Opening costs no filesystem call per shard: names are joined to the version
directory after text checks only (``manifest.joined_file``). A file a manifest
names is checked as it is first mapped or read: its size against the
manifest's, and, one ``lstat`` each (and one per split directory), that
neither it nor its directory is a symlink out of the version
(``manifest.version_file`` resolves those that are symlinks).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._io import sha256_file
from .errors import ConfigError, ValidationError
from .formats import ShardFormat, bosidx, get_format
from .manifest import Manifest, ShardEntry, joined_file, version_file
from .pins import removed_error

__all__ = ["ShardInfo", "ShardSet", "fingerprint"]

log = logging.getLogger("shardflow.reader")
_rehashed: set[tuple[str, int, int, int]] = set()
"""Files found to hold their published bytes under another mtime: (path, inode, size, mtime_ns), hashed once per process."""
_warned: set[Path] = set()


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard: its file, its token count, its ``.bos.idx`` (None when it has none) and its manifest entry.

    ``entry`` (sizes and SHA-256 of the shard and its index) is None for plain
    directories; callers that must not trust damaged files (incremental builds)
    check them against it before reading.
    """

    path: Path
    tokens: int
    index: Path | None
    entry: ShardEntry | None = None


def fingerprint(items: Any) -> str:
    """A short hash of ``items`` (JSON, keys sorted): what identifies a set of shards in resume states."""
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _read_only(a: np.ndarray) -> np.ndarray:
    # Cached arrays are handed to every caller; one writing into them would
    # silently change what all the others see.
    a.flags.writeable = False
    return a


class ShardSet:
    """The ordered shards of one split, their format and dtype, and where documents start.

    Built by ``from_manifest`` (a published or staged version) or by
    ``shardflow.runtime.open_shards`` (also plain directories). ``shard(k)`` is
    shard ``k``'s tokens as a read-only array over a memory map;
    ``doc_starts(k)`` the document starts within it; ``read(start, stop)`` and
    ``all_doc_starts()`` the same in split-wide token coordinates.
    """

    def __init__(
        self,
        *,
        name: str,
        shards: list[ShardInfo],
        fmt: ShardFormat,
        dtype: np.dtype,
        placement: Literal["bos", "eos", "both"],
        boundary_token: int | None,
        tokenizer: str | None,
        vocab_size: int | None,
        fingerprint: str,
        directory: Path,
        version: Any = None,
        published: dict[str, tuple[int, int]] | None = None,
        pin: Any = None,
    ) -> None:
        self.name = name
        """The reference as given (``NAME@vN`` for versions), for messages."""
        self.shards = shards
        self.format = fmt
        self.dtype = np.dtype(dtype)
        self.placement = placement
        """Where the boundary tokens sit: before (``bos``), after (``eos``) or around (``both``) each document.

        With ``both``, ``boundary_token`` is the BOS (the manifest's ``token_id``)."""
        self.boundary_token = boundary_token
        self.tokenizer = tokenizer
        """The tokenizer's name where the manifest records it (None for plain directories)."""
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        """Identifies exactly these shards (build key or file names and sizes); saved in resume states."""
        self.directory = directory
        self.version = version
        """The ``shardflow.reader.Version`` the set was opened from, if any (not pickled)."""
        self.published = published
        """``{file: (size, mtime_ns)}`` as published (``shardflow.pins.published_stats``): a shard or index whose
        file differs when it is first mapped or read is refused. None: not checked (plain directories, builds)."""
        self.pin = pin
        """The ``shardflow.pins.VersionPin`` that keeps ``shardflow rm`` off the version while this set lives
        (pickled as its directory: a copy in another process pins the version again). None: not pinned."""
        self.tokens = np.array([s.tokens for s in shards], dtype=np.int64)
        """Token count of every shard."""
        self.offsets = _read_only(np.concatenate(([0], np.cumsum(self.tokens))).astype(np.int64))
        """Token offset of each shard within the split (int64, length ``shards + 1``; the last is the total)."""
        self._views: list[np.ndarray | None] = [None] * len(shards)
        self._starts: list[np.ndarray | None] = [None] * len(shards)
        self._all_starts: np.ndarray | None = None
        self._real_dirs: set[str] = set()
        """Split directories found not to be symlinks (``_inside``), each looked at once per process."""

    @classmethod
    def from_manifest(
        cls, directory: Path | str, manifest: Manifest, split: str, *, version: Any = None,
        published: dict[str, tuple[int, int]] | None = None, pin: Any = None,
    ) -> "ShardSet":
        """Split ``split`` of the version in ``directory`` that ``manifest`` describes.

        Reads no file, and calls the filesystem for none: names are joined after text checks, and each
        file is checked as it is first used (sizes, symlinks: see the module), its checksum by validation.
        Each ``ShardInfo`` keeps its manifest entry. ``version`` is recorded for callers that need
        more of the version (its tokenizer); ``published`` and ``pin`` are what
        ``open_version`` gives a reader (see the attributes).
        """
        directory = Path(directory)
        try:
            entry = manifest.splits[split]
        except KeyError:
            raise KeyError(f"{manifest.ref} has no split {split!r}; its splits are {', '.join(manifest.splits)}") from None
        info = manifest.tokenized_info
        return cls(
            name=manifest.ref,
            shards=[
                ShardInfo(
                    path=joined_file(directory, s.file, f"shard {k} of split {split!r}"),
                    tokens=s.tokens,
                    index=joined_file(directory, s.index.file, f"the index of shard {k} of split {split!r}"),
                    entry=s,
                )
                for k, s in enumerate(entry.shards)
            ],
            fmt=get_format(manifest.format_name),
            dtype=np.dtype(manifest.dtype).newbyteorder("<"),
            placement=manifest.boundary["placement"],
            boundary_token=int(manifest.boundary["token_id"]),
            tokenizer=str(info["tokenizer"]) if info.get("tokenizer") else None,
            vocab_size=int(info["vocab_size"]),
            # Saved in resume states: keep it stable across releases.
            fingerprint=fingerprint({"build_key": manifest.build_key, "ref": manifest.ref, "split": split}),
            directory=directory,
            version=version,
            published=published,
            pin=pin,
        )

    # Memory maps and cached indexes stay out of pickles: a DataLoader worker
    # (spawn / forkserver) gets the small description and reopens what it uses.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_views"] = [None] * len(self.shards)
        state["_starts"] = [None] * len(self.shards)
        state["_all_starts"] = None
        state["_real_dirs"] = set()
        state["version"] = None
        return state

    def __repr__(self) -> str:
        return f"ShardSet({self.name!r}, shards={self.num_shards}, tokens={self.num_tokens}, dtype={self.dtype.name})"

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    # -- tokens ------------------------------------------------------------

    def shard(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens: a read-only array over its memory map (header and size checked once)."""
        view = self._views[k]
        if view is None:
            # A base-class view slices several times faster than np.memmap (no
            # subclass bookkeeping per slice); it keeps the map alive through .base.
            view = self._open(k).view(np.ndarray)
            self._views[k] = view
        return view

    def memmap(self, k: int) -> np.ndarray:
        """Shard ``k`` as the format opened it (an ``np.memmap``, a plain array when empty); ``shard``'s cache."""
        return self.shard(k).base  # type: ignore[return-value]

    def last_token(self, k: int) -> int | None:
        """Shard ``k``'s last token id (None when the shard is empty); reads one page.

        Does not keep a map it had to open: validation and builds ask this once
        per shard, and a set holding every shard mapped would keep deleted files'
        disk space.
        """
        info = self.shards[k]
        if info.tokens == 0:
            return None
        view = self._views[k]
        return int((view if view is not None else self._open(k))[-1])

    def _open(self, k: int) -> np.ndarray:
        info = self.shards[k]
        entry = info.entry
        check = None
        if entry is not None:
            self._inside(info.path, entry.file, f"shard {k}")
            # Given the stat the format takes anyway: one stat for the size and the published record.
            check = functools.partial(self._check_file, info.path, entry)
        try:
            mm = self.format.open(info.path, self.dtype) if check is None else \
                self.format.open(info.path, self.dtype, check=check)
        except FileNotFoundError:
            raise self._missing(info.path) from None
        if len(mm) != info.tokens:
            raise ValidationError(f"{info.path}: {len(mm)} tokens, but {info.tokens} were expected when it was opened")
        return mm

    def _inside(self, path: Path, name: str, what: str) -> os.stat_result:
        """``path``'s stat, after refusing it (``ManifestError``) if it, or the split directory of its manifest name
        ``name``, is a symlink out of the version. One ``lstat`` (and one per split directory, once): a regular
        file in a directory of the version that is not a symlink is inside it. Only a symlink is resolved."""
        head = name.rpartition("/")[0]
        try:
            if head and head not in self._real_dirs:
                if stat.S_ISLNK(os.lstat(self.directory / head).st_mode):
                    version_file(self.directory, head, f"the directory of {what} of {self.name}")
                self._real_dirs.add(head)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                version_file(self.directory, name, f"{what} of {self.name}")
                st = os.stat(path)
        except FileNotFoundError:
            raise self._missing(path) from None
        return st

    def _check_file(self, path: Path, entry: ShardEntry, st: os.stat_result) -> None:
        """A shard's size against the manifest, and its stat against the record of publish (if any)."""
        self._check_size(path, st, entry.bytes)
        if self.published is not None:
            self._check_published(path, entry.file, entry.sha256, st)

    @staticmethod
    def _check_size(path: Path, st: os.stat_result, size: int) -> None:
        if st.st_size != size:
            raise ValidationError(
                f"{path}: {st.st_size} bytes, but the manifest says {size}; the file is truncated or was changed"
            )

    def _check_published(self, path: Path, name: str, sha256: str, st: os.stat_result | None = None) -> None:
        """Refuse ``path`` (manifest name ``name``; ``st`` its stat, else taken) if it changed since it was published.

        Its size and mtime are compared with those recorded at publish. Where they differ, the
        bytes may still be the published ones (a copy that did not keep mtimes, a ``touch``): the
        file is hashed once (per process) and refused only if its SHA-256 is not the manifest's.
        """
        if st is None:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise self._missing(path) from None
        assert self.published is not None
        if (st.st_size, st.st_mtime_ns) == self.published.get(name):
            return
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _rehashed:
            return
        if self.directory not in _warned:
            _warned.add(self.directory)
            log.warning(
                "%s: files of %s whose modification times are not those recorded at publish are hashed as they are "
                "first read (a copy that did not keep mtimes? cp -a and rsync -a keep them)", self.directory, self.name
            )
        if sha256_file(path) != sha256:
            raise ValidationError(
                f"{path}: changed after {self.name} was published (its modification time is not the one the catalog "
                "recorded, and its SHA-256 is not the manifest's), so this reader refuses it. Check the version with "
                f"`shardflow validate {self.name}` and rebuild it (or restore the file); readers never serve a shard "
                "changed in place"
            )
        _rehashed.add(key)

    def _missing(self, path: Path) -> Exception:
        """A file of the set that is gone: its version removed under the reader (``shardflow rm``), or damaged."""
        if self.pin is not None and not self.directory.is_dir():
            return removed_error(self.name, self.directory, str(path))
        return ValidationError(
            f"{path}: missing; {self.name} is damaged. Check it with `shardflow validate {self.name}`, and rebuild it"
        )

    def locate(self, token: int) -> tuple[int, int]:
        """Split-wide token index -> (shard ``k``, token index within shard ``k``)."""
        if not 0 <= token < self.num_tokens:
            raise IndexError(f"token {token} out of range: split of {self.name} has {self.num_tokens} tokens")
        # side="right" skips empty shards, whose offset equals the next one's.
        k = int(np.searchsorted(self.offsets, token, side="right")) - 1
        return k, int(token - self.offsets[k])

    def first_token(self, k: int) -> int | None:
        """Shard ``k``'s first token id (None when the shard is empty); reads one page, keeps no new map."""
        info = self.shards[k]
        if info.tokens == 0:
            return None
        view = self._views[k]
        return int((view if view is not None else self._open(k))[0])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Split-wide tokens ``[start, stop)`` (clipped to the split), across shard boundaries when needed.

        Within one shard this is a view of its map; across shards, a copy.
        """
        start, stop = max(0, int(start)), min(int(stop), self.num_tokens)
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        offsets = self.offsets
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left")) - 1
        pieces = []
        for k in range(first, last + 1):
            base = int(offsets[k])
            pieces.append(self.shard(k)[max(start - base, 0) : min(stop - base, self.shards[k].tokens)])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    # -- documents ---------------------------------------------------------

    def has_index(self, k: int) -> bool:
        return self.shards[k].index is not None or self.boundary_token is not None

    def doc_starts(self, k: int, *, cache: bool = True) -> np.ndarray:
        """Document starts in shard ``k`` (token indices, ascending, read-only), from its ``.bos.idx``.

        A document continued from the previous shard has no entry. Plain
        directories without sidecars derive them from ``boundary_token`` (one
        vectorized pass over the shard, once); without either this raises.
        Kept as on disk: int32, or int64 for a shard of more than 2**31 - 1
        tokens (``bosidx.entry_dtype``); cached unless ``cache=False``.
        """
        starts = self._starts[k]
        if starts is None:
            info = self.shards[k]
            if info.index is not None:
                entry = info.entry.index if info.entry is not None else None
                st = None if entry is None else self._inside(info.index, entry.file, f"the index of shard {k}")
                if st is not None and entry is not None:
                    self._check_size(info.index, st, entry.bytes)
                try:
                    starts = bosidx.read(info.index, info.tokens)
                except FileNotFoundError:
                    raise self._missing(info.index) from None
                if self.published is not None and entry is not None:
                    self._check_published(info.index, entry.file, entry.sha256, st)
                self._check_index(k, starts)
            elif self.boundary_token is not None:
                starts = self._derive_starts(k).astype(bosidx.entry_dtype(info.tokens))
            else:
                raise ConfigError(
                    f"{info.path}: no {bosidx.BOS_IDX_SUFFIX} sidecar, so document starts are unknown; packing and "
                    "BOS alignment need them. Pass boundary_token=ID (and boundary='bos' or 'eos') to derive them"
                )
            starts = _read_only(starts)
            if cache:
                self._starts[k] = starts
        return starts

    def all_doc_starts(self) -> np.ndarray:
        """Every document start in split-wide token coordinates (int64, ascending, read-only; cached)."""
        if self._all_starts is None:
            # Per-shard starts are not kept for this (cache=False): the split-wide
            # array is what callers of this method look up, and it holds them all.
            parts = [
                self.doc_starts(k, cache=False).astype(np.int64) + self.offsets[k] for k in range(self.num_shards)
            ]
            self._all_starts = _read_only(np.concatenate(parts) if parts else np.empty(0, dtype=np.int64))
        return self._all_starts

    def _check_index(self, k: int, starts: np.ndarray) -> None:
        # Plain directories may hold sidecars written by other tools (NeMo's hold
        # byte offsets, not token indices). Where the boundary token is known,
        # check that the index points at it rather than trust it. A manifest's
        # indexes are covered by its checksums and by validation instead.
        if self.shards[k].entry is not None or self.boundary_token is None or not len(starts):
            return
        toks = self.shard(k)
        starts = starts.astype(np.int64)
        if self.placement in ("bos", "both"):
            ok = bool(np.all(toks[starts] == self.boundary_token))
        else:
            inner = starts[starts > 0]
            ok = bool(np.all(toks[inner - 1] == self.boundary_token))
        if not ok:
            raise ValidationError(
                f"{self.shards[k].index}: its entries do not point at document starts (token {self.boundary_token} "
                f"{'just before' if self.placement == 'eos' else 'at'} each entry); it is not a shardflow "
                ".bos.idx of token indices. Delete it or pass the right boundary_token"
            )

    def _derive_starts(self, k: int) -> np.ndarray:
        toks = self.shard(k)
        hits = np.flatnonzero(toks == self.boundary_token).astype(np.int64)
        if self.placement == "bos":
            return hits
        if self.placement == "both":
            # BOS + ids + EOS: when BOS and EOS are one token, a boundary token starts a
            # document exactly when the token after it is not the boundary token too
            # (documents are never empty; after the shard's last token comes the next shard's).
            after = np.empty(len(hits), dtype=np.int64)
            inside = hits + 1 < len(toks)
            after[inside] = toks[hits[inside] + 1]
            if len(hits) and not inside[-1]:
                nxt = self.first_token(k + 1) if k + 1 < self.num_shards else None
                after[-1] = self.boundary_token if nxt is None else nxt
            return hits[after != self.boundary_token]
        starts = hits + 1
        starts = starts[starts < len(toks)]
        # Shard k starts a document iff it is the first shard or the previous one ends with EOS.
        prev_ends = k == 0 or self.last_token(k - 1) == self.boundary_token
        if prev_ends and len(toks):
            starts = np.concatenate(([0], starts))
        return starts
