"""The map-style dataset: fixed windows of a split's shards, optionally packed or BOS-aligned.

    ds = TokenDataset("wikitext@latest", split="train", seq_len=1024)
    item = ds[0]      # {"input_ids": int64[1024], "labels": int64[1024]}

Windows, packing (``shardflow.runtime.packing``), BOS alignment and ``align_rule="nemo"``:
docs/RUNTIME.md ("Map-style"). The document continued from the previous shard, and aligned windows
that would run past the shard's end, are not used. Items are fresh int64 arrays (``labels`` needs
-100; PyTorch's embedding and loss want int64), never views of the memory maps.
"""

from __future__ import annotations

import bisect
import mmap
import operator
import os
from typing import Any, Iterator

import numpy as np

from ..errors import ConfigError, ValidationError
from ..formats import bosidx
from .options import DATASET_OPTIONS, REMOTE_OPTIONS, SHARD_OPTIONS, AlignRule, Overflow, ReadOptions
from .packing import pack_fields
from .prefetch import Readahead
from .remote import RemoteShardSet, is_remote_ref, open_remote_split
from .shards import ShardSet, open_shards

__all__ = ["TokenDataset", "aligned_starts"]

_ALIGN_GAP = {"shardflow": 0, "nemo": 1}
"""Tokens between one aligned sample's last label and the earliest start of the next, per rule."""

ID_GROUP_BITS = 6
"""Token ids are checked against the vocabulary for groups of ``2**ID_GROUP_BITS`` (64) consecutive samples of
one shard at once, before the first of them is served: one vectorized pass over their windows in the shard
being read (a numpy call per window would cost a tenth of a sample's time), then one byte per group says
it was done, in memory shared with forked DataLoader workers (a group is checked once per process tree, not
once per pass). A group never reaches into another shard: a streaming reader's fetch plan sees only the
shards it reads."""


def aligned_starts(
    doc_starts: np.ndarray, ntokens: int, seq_len: int, overflow: Overflow = "skip", rule: AlignRule = "shardflow"
) -> np.ndarray:
    """The sample starts of one shard with BOS alignment (int64, ascending).

    ``rule="nemo"``: the next start is the first document start at or after
    ``s + seq_len + 1`` (NeMo's ``NanogptDataset``), not ``s + seq_len``.

    One step per *sample* (not per token): the successor of every document
    start is found at once with a vectorized binary search, then the chain is
    followed. ``overflow="continue"`` also adds continuation starts inside
    documents longer than a window.
    """
    window = seq_len + 1
    starts = np.asarray(doc_starts, dtype=np.int64)
    # Only starts whose whole window fits in the shard can begin a sample; the
    # chain only moves forward, so the first start that does not fit ends it.
    fits = starts[: int(np.searchsorted(starts, ntokens - window, side="right"))]
    if not len(fits):
        return np.empty(0, dtype=np.int64)
    if overflow == "skip":
        succ = np.searchsorted(fits, fits + seq_len + _ALIGN_GAP[rule], side="left").tolist()
        chain: list[int] = []
        i, m = 0, len(fits)
        while i < m:
            chain.append(i)
            i = succ[i]
        return fits[chain]
    # "continue": p -> p + seq_len when the token at p + seq_len lies inside a
    # document longer than a window (it is cut there and continues), else the
    # next document start at or after p + seq_len.
    all_starts = starts.tolist()
    ends = all_starts[1:] + [ntokens]
    out: list[int] = []
    p = int(fits[0])
    last = ntokens - window
    while p <= last:
        out.append(p)
        q = p + seq_len
        j = bisect.bisect_left(all_starts, q)
        if j < len(all_starts) and all_starts[j] == q:
            p = q
        elif ends[j - 1] - all_starts[j - 1] > window:
            p = q
        elif j < len(all_starts):
            p = all_starts[j]
        else:
            break
    return np.asarray(out, dtype=np.int64)


class TokenDataset:
    """Fixed-length training samples of one split, by index.

    ``ref`` is ``NAME@VERSION``, ``NAME@latest``, a version directory or its
    ``metadata.yaml``, a plain directory (or glob) of shards, or an opened
    ``ShardSet``. The options are keywords or ``options=ReadOptions(...)``;
    ``seq_len`` is required. ``catalog=None`` means ``$SHARDFLOW_CATALOG`` or
    ``./manifests``; ``verify=True`` checks every checksum when opening. For
    plain directories, ``dtype`` (needed for headerless ``.bin`` shards),
    ``format``, ``pattern`` (default ``"*{split}*"``), ``boundary_token`` and
    ``boundary`` describe the files (see ``open_shards``).

    On object storage: ``ref`` a version URL (``s3://bucket/prefix/NAME/vN``),
    or ``NAME@VERSION`` with ``catalog="s3://..."``. Opening reads the manifest
    (and ``align_to_bos`` every shard's index, not its tokens); each shard is
    fetched into ``cache_dir`` (``$SHARDFLOW_CACHE``, ``~/.cache/shardflow``) and
    verified when a sample first needs it (see ``shardflow.runtime.remote``).
    ``cache_limit_bytes`` bounds the shards one process keeps: past it, the
    shards it opened first are evicted. Iterating, or ``ShardSampler``, fetches
    the next shards ahead of the one being read.
    """

    def __init__(
        self, ref: "str | os.PathLike[str] | ShardSet", *, options: ReadOptions | None = None, **kwargs: Any
    ) -> None:
        opts = ReadOptions.collect("TokenDataset.__init__", DATASET_OPTIONS, options, kwargs)
        if opts.seq_len is None:
            raise TypeError("TokenDataset.__init__() missing 1 required keyword-only argument: 'seq_len'")
        self.seq_len = opts.seq_len
        self.align_rule: AlignRule = opts.align_rule
        self.pack_sequences = opts.pack_sequences
        self.align_to_bos = opts.align_to_bos
        self.overflow: Overflow = opts.overflow
        self.split = split = opts.split
        if is_remote_ref(ref, opts.catalog):
            # The manifest now; each shard fetched when first read, the oldest dropped past cache_limit_bytes.
            remote = open_remote_split(ref, options=opts.only(REMOTE_OPTIONS))
            remote.hold_at_most(opts.cache_limit_bytes)
            self.shards: ShardSet = remote
        else:
            if opts.cache_dir is not None or opts.cache_limit_bytes is not None:
                raise ConfigError(
                    f"cache_dir and cache_limit_bytes are for versions on object storage (s3://...); {ref!r} is read in place"
                )
            self.shards = open_shards(ref, options=opts.only(SHARD_OPTIONS))
        window = self.seq_len + 1
        self._window = window
        if self.align_to_bos:
            if isinstance(self.shards, RemoteShardSet):
                self.shards.fetch_indexes()  # all of them now, concurrently, not one request at a time below
            # Needs every shard's index now (not its tokens); the indexes are
            # kept only when packing will look them up again.
            per_shard = [
                aligned_starts(
                    self.shards.doc_starts(k, cache=self.pack_sequences), int(n), self.seq_len, self.overflow, self.align_rule
                )
                for k, n in enumerate(self.shards.tokens)
            ]
            counts = np.array([len(p) for p in per_shard], dtype=np.int64)
            # Shard-local starts, as narrow as the largest shard allows: int32 unless a
            # shard holds more than 2**31 - 1 tokens (a nanoGPT train.bin), then int64.
            local = bosidx.entry_dtype(int(self.shards.tokens.max()) if len(per_shard) else 0)
            self._starts: np.ndarray | None = (
                np.concatenate(per_shard).astype(local) if per_shard else np.empty(0, dtype=local)
            )
        else:
            counts = self.shards.tokens // window
            self._starts = None
        self.sample_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        """Samples ``sample_offsets[k]:sample_offsets[k+1]`` come from shard ``k`` (length shards + 1)."""
        self._cum: list[int] = self.sample_offsets.tolist()
        self._views = self.shards._views  # the ShardSet's list of opened maps, filled as shards are used
        self._len = int(self.sample_offsets[-1])
        self._checked, self._groups = self._id_checks()
        if self._len == 0:
            largest = int(self.shards.tokens.max()) if self.shards.num_shards else 0
            how = "with a document start early enough for a whole window" if self.align_to_bos else "of at least that many tokens"
            raise ValueError(
                f"{self.shards.name} split {split!r} yields no sample: seq_len={self.seq_len} needs windows of "
                f"{window} tokens within one shard, {how}; its largest shard has {largest} tokens. "
                "Use a smaller seq_len or rebuild with larger shards"
            )

    # The alias of the ShardSet's map list must not be pickled on its own (it
    # would carry the maps' data); it is re-made from the unpickled ShardSet.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_views"]
        state.pop("_checked", None)
        state.pop("_groups", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views = self.shards._views
        self._checked, self._groups = self._id_checks()  # one byte per 64 samples: made again, not pickled

    # -- token ids against the vocabulary ------------------------------------

    def _id_checks(self) -> tuple[bytearray | mmap.mmap, list[int]]:
        """One byte per group of samples (``ID_GROUP_BITS``), set once its windows' token ids were checked, and
        each shard's first group. All set where no id can be out of range (no vocabulary known, as for plain
        directories, or one the dtype cannot exceed). The bytes are an anonymous shared mapping: a group that a
        forked DataLoader worker checked is checked for the parent and the workers of later passes too."""
        per_shard = [((b - a) + (1 << ID_GROUP_BITS) - 1) >> ID_GROUP_BITS for a, b in zip(self._cum, self._cum[1:])]
        first = [0]
        for n in per_shard:
            first.append(first[-1] + n)
        vocab = self.shards.vocab_size
        if vocab is None or int(np.iinfo(self.shards.dtype).max) < vocab:
            return bytearray(b"\x01") * first[-1], first
        return mmap.mmap(-1, max(first[-1], 1)), first

    def _check_ids(self, k: int, group: int, view: np.ndarray) -> None:
        """Refuse the windows of sample group ``group`` (of shard ``k``, whose tokens are ``view``) if a token id
        in them is at or above the vocabulary size: one ``argmax`` over the tokens from the group's first window
        to its last (a few hundred kilobytes at most, never the whole shard), then the group is marked checked."""
        base = self._cum[k]
        a = base + ((group - self._groups[k]) << ID_GROUP_BITS)  # the group's first sample and its last (b)
        b = min(a + (1 << ID_GROUP_BITS), self._cum[k + 1]) - 1
        starts = self._starts
        if starts is None:
            first, last = (a - base) * self._window, (b + 1 - base) * self._window
        else:
            first, last = int(starts[a]), int(starts[b]) + self._window
        toks = view[first:last]
        at = toks.argmax()
        if toks[at] >= self.shards.vocab_size:
            name = self.shards.name
            raise ValidationError(
                f"{self.shards.shards[k].path}: token id {int(toks[at])} at token {first + int(at)} is not below the "
                f"vocabulary size {self.shards.vocab_size:,} of {name}: the shard was changed after it was published, "
                f"or is damaged. Check it with `shardflow validate {name}` and rebuild it; readers never serve such ids"
            )
        self._checked[group] = 1

    # -- description -------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        opts = [f"seq_len={self.seq_len}"]
        if self.pack_sequences:
            opts.append("pack_sequences=True")
        if self.align_to_bos:
            opts.append(f"align_to_bos=True, overflow={self.overflow!r}")
            if self.align_rule != "shardflow":
                opts.append(f"align_rule={self.align_rule!r}")
        return f"TokenDataset({self.shards.name!r}, split={self.split!r}, {', '.join(opts)}, samples={self._len})"

    @property
    def num_shards(self) -> int:
        return self.shards.num_shards

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What determines the samples; a resume state records it and refuses another dataset."""
        return {
            "shards": self.shards.fingerprint,
            "split": self.split,
            "seq_len": self.seq_len,
            "pack_sequences": self.pack_sequences,
            "align_to_bos": self.align_to_bos,
            "overflow": self.overflow,
            "samples": self._len,
            # Only when not the default, so that resume states saved before the option still match.
            **({"align_rule": self.align_rule} if self.align_rule != "shardflow" else {}),
        }

    # -- access --------------------------------------------------------------

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, first token within the shard)`` of sample ``index``."""
        i = self._index(index)
        k = bisect.bisect_right(self._cum, i) - 1
        start = int(self._starts[i]) if self._starts is not None else (i - self._cum[k]) * self._window
        return k, start

    def _index(self, index: Any) -> int:
        i = operator.index(index)
        n = self._len
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {index} out of range: {self.shards.name} split {self.split!r} has {n} samples")
        return i

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        # The hot path of random access, kept to a handful of bytecodes: a
        # bisect over a Python list, one slice of a plain ndarray view, two
        # int64 copies (separate arrays: editing labels never touches inputs).
        i = index if type(index) is int else operator.index(index)
        n = self._len
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError(f"sample {index} out of range: {self.shards.name} split {self.split!r} has {n} samples")
        cum = self._cum
        k = bisect.bisect_right(cum, i) - 1
        j = i - cum[k]
        starts = self._starts
        start = j * self._window if starts is None else int(starts[i])
        view = self._views[k]
        if view is None:
            view = self.shards.shard(k)
        g = self._groups[k] + (j >> 6)  # >> ID_GROUP_BITS: the group's ids are checked before any is served
        if not self._checked[g]:
            self._check_ids(k, g, view)
        w = view[start : start + self._window]
        item = {"input_ids": w[:-1].astype(np.int64), "labels": w[1:].astype(np.int64)}
        if self.pack_sequences:
            item.update(pack_fields(self.shards.doc_starts(k), start, item["labels"]))
        return item

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        shards = self.shards
        if not isinstance(shards, RemoteShardSet):
            for i in range(self._len):
                yield self[i]
            return
        ahead = Readahead(shards, [k for k in range(shards.num_shards) if self._cum[k + 1] > self._cum[k]])
        try:
            for k in range(shards.num_shards):  # in order: the next shards are fetched while one is read
                ahead.reached(k)
                for i in range(self._cum[k], self._cum[k + 1]):
                    yield self[i]
        finally:
            ahead.close()

    def window(self, index: int) -> np.ndarray:
        """The raw ``seq_len + 1`` tokens of sample ``index`` (a read-only view, storage dtype)."""
        k, start = self.locate(index)
        view = self.shards.shard(k)
        g = self._groups[k] + ((self._index(index) - self._cum[k]) >> ID_GROUP_BITS)
        if not self._checked[g]:
            self._check_ids(k, g, view)
        return view[start : start + self._window]
