"""The ``megatron`` shard format: Megatron-LM's indexed dataset, one ``P.bin`` + ``P.idx`` pair per shard.

Follows ``megatron/core/datasets/indexed_dataset.py`` (NVIDIA/Megatron-LM: ``_IndexWriter``,
``_IndexReader``, ``IndexedDatasetBuilder``, ``DType``). ``P.bin`` is headerless, as ``bin``;
``P.idx`` holds one sequence per document piece, starting at the shard's ``.bos.idx`` entries, and
``document_indices = [0, 1, ..., S]``. uint16 shards get DType code 8 and uint32 shards code 4
(int32: Megatron has no uint32; the same bytes for ids below 2**31). The layout, byte by byte, and
what validation checks: docs/FORMAT.md (section ``megatron``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ValidationError
from .rawbin import RawBinFormat

__all__ = [
    "MegatronFormat",
    "MEGATRON",
    "IDX_MAGIC",
    "IDX_VERSION",
    "IDX_SUFFIX",
    "DTYPE_CODES",
    "MegatronIndex",
    "idx_path",
    "is_megatron_idx",
    "sequence_starts",
    "encode_idx",
    "parse_idx",
]

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
IDX_SUFFIX = ".idx"
_HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count: 34 bytes

# Megatron's DType enum (megatron/core/datasets/indexed_dataset.py), code -> numpy dtype name.
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
# shardflow's token dtypes as Megatron records them (uint32 has no code: int32, same bytes below 2**31) ...
_CODE_OF = {"uint16": 8, "uint32": 4}
# ... and back, for files whose dtype shardflow must take from the .idx.
_TOKEN_DTYPE_OF = {8: np.dtype("<u2"), 4: np.dtype("<u4")}


def idx_path(shard: Path) -> Path:
    """``P.idx`` for the shard ``P.bin``: same directory and stem."""
    return shard.with_name(shard.stem + IDX_SUFFIX)


def is_megatron_idx(path: Path) -> bool:
    """Whether ``path`` is a file that begins with Megatron's index magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(IDX_MAGIC)) == IDX_MAGIC
    except OSError:
        return False


def sequence_starts(ntokens: int, starts: np.ndarray) -> np.ndarray:
    """Where the shard's sequences start (int64 token indices): its document starts, and 0 if not among them."""
    s = np.asarray(starts, dtype=np.int64)
    if ntokens == 0:
        return np.empty(0, dtype=np.int64)
    if not len(s) or s[0] != 0:
        s = np.concatenate(([0], s))
    return s


def _code(dtype: np.dtype) -> int:
    try:
        return _CODE_OF[np.dtype(dtype).name]
    except KeyError:
        raise ConfigError(f"format 'megatron' stores uint16 or uint32 tokens, not {np.dtype(dtype)}") from None


def encode_idx(ntokens: int, dtype: np.dtype, starts: np.ndarray) -> bytes:
    """The ``.idx`` bytes of a shard of ``ntokens`` tokens whose documents start at ``starts``."""
    dt = np.dtype(dtype)
    seq = sequence_starts(ntokens, starts)
    lengths = np.diff(np.concatenate((seq, [ntokens]))).astype("<i4")
    pointers = (seq * dt.itemsize).astype("<i8")
    documents = np.arange(len(seq) + 1, dtype="<i8")
    head = _HEAD.pack(IDX_MAGIC, IDX_VERSION, _code(dt), len(seq), len(documents))
    return head + lengths.tobytes() + pointers.tobytes() + documents.tobytes()


@dataclass(frozen=True)
class MegatronIndex:
    """A parsed ``.idx``: its dtype code and its three arrays."""

    dtype_code: int
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray


def parse_idx(data: bytes, where: str | Path) -> MegatronIndex:
    """Parse ``.idx`` bytes; raises ``ValidationError`` on a bad magic, version, code or size."""
    if len(data) < _HEAD.size:
        raise ValidationError(f"{where}: {len(data)} bytes, shorter than the {_HEAD.size}-byte Megatron .idx header")
    magic, version, code, nseq, ndoc = _HEAD.unpack_from(data)
    if magic != IDX_MAGIC:
        raise ValidationError(f"{where}: .idx magic {magic!r} is not Megatron's {IDX_MAGIC!r}; wrong file or a damaged header")
    if version != IDX_VERSION:
        raise ValidationError(f"{where}: unsupported Megatron .idx version {version} (expected {IDX_VERSION})")
    if code not in DTYPE_CODES:
        raise ValidationError(f"{where}: Megatron dtype code {code} is not one of {sorted(DTYPE_CODES)}")
    expected = _HEAD.size + 12 * nseq + 8 * ndoc
    if len(data) != expected:
        raise ValidationError(
            f"{where}: {len(data)} bytes, but its header says {nseq} sequences and {ndoc} document indices "
            f"({expected} bytes)"
        )
    off = _HEAD.size
    lengths = np.frombuffer(data, dtype="<i4", count=nseq, offset=off)
    pointers = np.frombuffer(data, dtype="<i8", count=nseq, offset=off + 4 * nseq)
    docs = np.frombuffer(data, dtype="<i8", count=ndoc, offset=off + 12 * nseq)
    return MegatronIndex(code, lengths, pointers, docs)


class MegatronFormat(RawBinFormat):
    """Headerless ``P.bin`` tokens plus Megatron's ``P.idx`` sidecar (one sequence per document piece)."""

    name = "megatron"
    extension = "bin"
    header_magic = None

    def unknown_dtype(self, path: Path) -> np.dtype:
        """The dtype is the manifest's, else the sibling ``.idx``'s (never the file size's)."""
        return self._idx_dtype(path)

    def _idx_dtype(self, path: Path) -> np.dtype:
        idx = idx_path(path)
        try:
            with open(idx, "rb") as f:
                raw = f.read(_HEAD.size)
        except OSError:
            raise ConfigError(
                f"{path}: a megatron .bin records its dtype in {idx.name}, which cannot be read; pass dtype='uint16' "
                "or 'uint32'. shardflow never guesses a dtype from the file size"
            ) from None
        if len(raw) < 18 or raw[:9] != IDX_MAGIC:
            raise ValidationError(f"{idx}: not a Megatron .idx (no {IDX_MAGIC!r} header); its dtype is unknown")
        code = raw[17]
        if code not in _TOKEN_DTYPE_OF:
            name = DTYPE_CODES.get(code, "unknown")
            raise ValidationError(
                f"{idx}: Megatron dtype code {code} ({name}); shardflow reads token ids stored as uint16 (8) or int32 (4)"
            )
        return _TOKEN_DTYPE_OF[code]

    def sidecars(self, shard_path: Path, ntokens: int, dtype: np.dtype, starts: np.ndarray) -> dict[Path, bytes]:
        return {idx_path(shard_path): encode_idx(ntokens, dtype, starts)}

    def check_sidecars(self, shard_path: Path, ntokens: int, dtype: np.dtype, starts: np.ndarray) -> list[str]:
        path = idx_path(shard_path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []  # a missing listed file is reported by the caller
        try:
            index = parse_idx(data, path)
        except ValidationError as exc:
            return [str(exc)]
        problems: list[str] = []
        dt = np.dtype(dtype)
        want = _code(dt)
        if index.dtype_code != want:
            problems.append(
                f"{path}: dtype code {index.dtype_code} ({DTYPE_CODES[index.dtype_code]}), but the manifest's "
                f"{dt.name} tokens are code {want} ({DTYPE_CODES[want]})"
            )
            return problems
        lengths = index.sequence_lengths.astype(np.int64)
        pointers = index.sequence_pointers
        if len(lengths) and int(lengths.min()) < 0:
            problems.append(f"{path}: sequence {int(np.argmin(lengths))} has a negative length")
        if int(lengths.sum()) != ntokens:
            problems.append(f"{path}: sequence lengths add up to {int(lengths.sum())} tokens, the shard holds {ntokens}")
        consecutive = np.concatenate(([0], np.cumsum(lengths)[:-1])) * dt.itemsize if len(lengths) else lengths
        if not np.array_equal(pointers, consecutive):
            bad = int(np.flatnonzero(pointers != consecutive)[0])
            problems.append(
                f"{path}: sequence {bad} points at byte {int(pointers[bad])}, not {int(consecutive[bad])}; pointers "
                "must be consecutive byte offsets into the .bin"
            )
        if not np.array_equal(index.document_indices, np.arange(len(lengths) + 1)):
            problems.append(
                f"{path}: document indices are not 0, 1, ..., {len(lengths)} (one sequence per document, "
                f"{len(lengths) + 1} entries); it has {len(index.document_indices)}"
            )
        expected = sequence_starts(ntokens, starts)
        if not problems and not np.array_equal(pointers // dt.itemsize, expected):
            got = pointers // dt.itemsize
            n = min(len(got), len(expected))
            diff = np.flatnonzero(got[:n] != expected[:n])
            at = int(diff[0]) if len(diff) else n
            problems.append(
                f"{path}: {len(got)} sequences, {len(expected)} document starts in {shard_path.name} "
                f"(its .bos.idx, and 0 when it begins mid-document); they first differ at sequence {at}"
            )
        return problems


MEGATRON = MegatronFormat()
