"""Readers written from each training stack's published format rules: what its own loader does with our files.

They are specifications, not copies: each follows the rules its stack's
reading code applies (header fields it asserts, the dtype it assumes, the
glob it runs, how it finds documents), and fails the way that code would.

* modded-nanogpt / llm.c ``_load_data_shard``: int32 header of 256 words,
  word 0 = 20240520, word 1 = 1, word 2 = token count; uint16 tokens after
  1024 bytes; documents begin at the hard-coded BOS 50256. Its
  ``distributed_data_generator`` (``modded_batches``): train batches of whole
  documents from the BOS positions, the next file loaded ahead; val batches
  read straight on.
* NeMo Automodel ``NanogptDataset``: the same header with magic 278895051
  (word 3 = bytes per token) or 20240520 (uint16); ``P.bos.idx`` beside
  ``P.bin``: int32 positions of the BOS tokens; a BOS-aligned sample starts at
  a BOS ``s`` with ``s + seq_len + 1`` tokens left in the file, the next at the
  first BOS at or after ``s + seq_len + 1``.
* KempnerForge ``MemoryMappedDataset``: ``sorted(glob(dir/"*.npy"))``, each
  ``np.load(mmap_mode="r")``; packing cuts documents after each EOS.
* OLMo-core numpy datasets: each path memory-mapped with the configured dtype,
  no header; documents end at the EOS id.
* nanoGPT ``train.py``: ``np.memmap(data_dir/"train.bin", dtype=np.uint16)``.
* shardflow's own ``P.bos.idx`` (docs/FORMAT.md), which NeMo reads and nanoGPT
  ignores: no header, little-endian int32 document starts for a shard of at
  most 2**31 - 1 tokens, int64 for a larger one (a nanoGPT ``train.bin``).
* Megatron-LM ``IndexedDataset(P)``: ``P.idx`` = ``MMIDIDX\\x00\\x00``, uint64
  version 1, uint8 dtype code, uint64 sequence count, uint64 document count,
  int32 lengths, int64 byte pointers, int64 document indices; ``P.bin``
  memory-mapped with the code's dtype.
"""

from __future__ import annotations

import glob
import struct
from pathlib import Path

import numpy as np

MODDED_MAGIC, NEMO_MAGIC = 20240520, 278895051
MODDED_BOS = 50256
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def _header(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<i4", count=256)


def modded_shard(path: Path) -> np.ndarray:
    header = _header(path)
    assert header[0] == MODDED_MAGIC, f"magic number mismatch in the data .bin file {path}"
    assert header[1] == 1, "unsupported version"
    n = int(header[2])
    assert path.stat().st_size == 1024 + 2 * n, "number of tokens read does not match header"
    return np.fromfile(path, dtype="<u2", offset=1024)


def modded_files(pattern: str) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(pattern))]


class _ModdedShard:
    """modded-nanogpt's ``Shard`` on one rank: BOS positions, and the next batch's documents from them."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens, self.size, self.i = tokens, len(tokens), 0
        self.bos_idx = np.flatnonzero(tokens == MODDED_BOS)

    def next_batch(self, num_tokens: int, max_seq_len: int) -> tuple[list[int], list[int]]:
        n, idx, cur_len, starts, ends = len(self.bos_idx), self.i, 0, [], []
        while cur_len <= num_tokens:
            if idx >= n:
                raise StopIteration("Insufficient BOS ahead; hit tail of shard.")
            cur = int(self.bos_idx[idx])
            starts.append(cur)
            idx += 1
            end = min(int(self.bos_idx[idx]) if idx < n else self.size, cur + max_seq_len, cur + num_tokens - cur_len + 1)
            ends.append(end)
            cur_len += end - cur
        assert cur_len == num_tokens + 1
        self.i = idx
        return starts, ends


def modded_batches(pattern: str, num_tokens: int, max_seq_len: int, *, align_to_bos: bool):
    """modded-nanogpt's ``distributed_data_generator`` on one rank: each batch's ``num_tokens`` input tokens.

    As there, the BOS-aligned (train) loader loads the second file before the first batch
    (``Shard.load_async(next(file_iter))``, so one file ends the generator with ``RuntimeError``), and the
    unaligned (val) loader moves to the next file unless a batch and one more token fit in this one.
    """
    files = modded_files(pattern)
    if not files:
        raise FileNotFoundError(f"No files found for pattern: {pattern}")
    file_iter = iter(files)
    tokens = modded_shard(next(file_iter))
    if align_to_bos:
        shard = _ModdedShard(tokens)
        ahead: np.ndarray | None = modded_shard(next(file_iter))
    else:
        pos = 0
    while True:
        if align_to_bos:
            try:
                starts, ends = shard.next_batch(num_tokens, max_seq_len)
            except StopIteration:
                if ahead is None:
                    raise TypeError("'NoneType' object is not callable") from None  # next_shard_getter is None
                shard = _ModdedShard(ahead)
                tokens = shard.tokens
                try:
                    ahead = modded_shard(next(file_iter))
                except StopIteration:
                    ahead = None
                continue
            buf = np.concatenate([tokens[i:j] for i, j in zip(starts, ends)])
        else:
            if pos + num_tokens + 1 >= len(tokens):
                tokens, pos = modded_shard(next(file_iter)), 0
            buf = tokens[pos : pos + num_tokens + 1]
            pos += num_tokens
        yield buf[:-1]


def split_at_bos(tokens: np.ndarray, bos: int) -> list[list[int]]:
    """Documents of a BOS-separated stream: each starts at a BOS (the stream must start with one)."""
    starts = np.flatnonzero(tokens == bos).tolist()
    assert starts and starts[0] == 0, "the stream does not begin with the BOS token"
    return [tokens[a:b].tolist() for a, b in zip(starts, starts[1:] + [len(tokens)])]


def split_after_eos(tokens: np.ndarray, eos: int) -> list[list[int]]:
    """Documents of an EOS-terminated stream: each ends with an EOS (the stream must end with one)."""
    ends = (np.flatnonzero(tokens == eos) + 1).tolist()
    assert ends and ends[-1] == len(tokens), "the stream does not end with the EOS token"
    return [tokens[a:b].tolist() for a, b in zip([0] + ends[:-1], ends)]


def nemo_shard(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, BOS positions from P.bos.idx)``."""
    header = _header(path)
    if header[0] == NEMO_MAGIC:
        assert header[1] == 1
        width = int(header[3])
    else:
        assert header[0] == MODDED_MAGIC, f"{path}: unknown magic {header[0]}"
        width = 2
    n = int(header[2])
    dtype = {2: "<u2", 4: "<u4"}[width]
    tokens = np.fromfile(path, dtype=dtype, offset=1024)
    assert len(tokens) == n
    idx = path.with_name(path.stem + ".bos.idx")
    return tokens, np.fromfile(idx, dtype="<i4")


def nemo_sample_starts(bos_positions: np.ndarray, ntokens: int, seq_len: int) -> list[int]:
    out: list[int] = []
    positions = bos_positions.tolist()
    i = 0
    while i < len(positions) and positions[i] + seq_len + 1 <= ntokens:
        s = positions[i]
        out.append(s)
        nxt = s + seq_len + 1
        while i < len(positions) and positions[i] < nxt:
            i += 1
    return out


def kempner_files(directory: Path) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(directory / "*.npy")))]


def kempner_tokens(directory: Path) -> np.ndarray:
    return np.concatenate([np.load(p, mmap_mode="r") for p in kempner_files(directory)])


def olmo_tokens(paths: list[Path], dtype: str) -> np.ndarray:
    return np.concatenate([np.memmap(p, dtype=np.dtype(dtype), mode="r") for p in paths])


def nanogpt_tokens(data_dir: Path, split: str) -> np.ndarray:
    return np.memmap(data_dir / f"{split}.bin", dtype=np.uint16, mode="r")


def shardflow_bos_idx(path: Path, ntokens: int, int32_max: int = 2**31 - 1) -> np.ndarray:
    """The document starts in ``P.bos.idx`` of a shard of ``ntokens`` tokens (``int32_max``: FORMAT.md's limit)."""
    dtype = np.dtype("<i4" if ntokens <= int32_max else "<i8")
    data = Path(path).read_bytes()
    assert len(data) % dtype.itemsize == 0, f"{path}: not a whole number of {dtype} entries"
    return np.frombuffer(data, dtype=dtype)


def megatron_documents(prefix: Path) -> list[list[int]]:
    """Every sequence of ``P`` as ``IndexedDataset`` reads it, grouped into the documents its index lists."""
    data = Path(f"{prefix}.idx").read_bytes()
    assert data[:9] == b"MMIDIDX\x00\x00", "Index file doesn't match expected format"
    (version,) = struct.unpack_from("<Q", data, 9)
    assert version == 1
    (code,) = struct.unpack_from("<B", data, 17)
    seqs, docs = struct.unpack_from("<QQ", data, 18)
    off = 34
    lengths = np.frombuffer(data, dtype="<i4", count=seqs, offset=off)
    off += 4 * seqs
    pointers = np.frombuffer(data, dtype="<i8", count=seqs, offset=off)
    off += 8 * seqs
    doc_idx = np.frombuffer(data, dtype="<i8", count=docs, offset=off)
    assert off + 8 * docs == len(data)
    dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
    binary = np.memmap(f"{prefix}.bin", dtype=np.uint8, mode="r")
    sequences = [
        np.frombuffer(binary, dtype=dtype, count=int(n), offset=int(p)).tolist() for n, p in zip(lengths, pointers)
    ]
    return [sum(sequences[a:b], []) for a, b in zip(doc_idx[:-1].tolist(), doc_idx[1:].tolist())]
