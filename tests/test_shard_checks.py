"""A shard is checked as it is written, before it is committed: the checks ``shardflow validate`` runs on a
file (``shard_checks.ShardScan``), run on the arrays the writers are about to write.

Each kind of damage a build could write is refused by the writer, in one message naming the file, and leaves
no file behind (neither the shard nor its temporary name): an id at or past the vocabulary, a document
without its boundary token, document starts that are not where the boundary tokens are, a header that
does not say what was written, a format's sidecar that does not read back as the documents.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from shardflow.errors import ValidationError
from shardflow.formats import MEGATRON, NANOGPT, RAWBIN, bosidx
from shardflow.formats.megatron import MegatronFormat, encode_idx, idx_path
from shardflow.formats.nanogpt import NanoGPTFormat
from shardflow.formats.unit_writer import UnitShardWriter
from shardflow.formats.writer import ShardWriter, write_sidecars
from shardflow.shard_checks import ShardContext, ShardScan

DTYPE = np.dtype("<u2")
BOS = 900  # BOS placement: every document begins with it
VOCAB = 1000


def context(placement: str = "bos", *, boundary: int = BOS, eos: int | None = None) -> ShardContext:
    return ShardContext(format_name="bin", dtype="uint16", vocab_size=VOCAB, boundary=boundary, placement=placement,
                        bos_id=BOS if placement != "eos" else None, eos_id=eos, whole_documents=True)


def docs(*lengths: int, bos: int = BOS) -> tuple[np.ndarray, list[int]]:
    """Documents of these lengths, each its BOS then ids 1, 2, ...: their tokens and lengths."""
    return np.concatenate([np.array([bos, *range(1, n)], dtype=DTYPE) for n in lengths]), list(lengths)


def unit_writer(tmp_path: Path, ctx: ShardContext, fmt=RAWBIN, bound: int = 8) -> UnitShardWriter:
    return UnitShardWriter(fmt, lambda i: tmp_path / f"piece-{i:06d}.{fmt.extension}", DTYPE, bound,
                           check=lambda path: ShardScan(ctx, path, bosidx.index_path(path)))


def test_checked_pieces_are_committed_with_their_files_identities(tmp_path):
    tokens, lengths = docs(3, 4, 5)
    with unit_writer(tmp_path, context()) as w:
        w.write(tokens, lengths)
        shards = w.close()
    assert [(s.tokens, s.documents) for s in shards] == [(7, 2), (5, 1)]
    for s in shards:  # (bytes, inode, mtime) of the piece and its index, as committed
        files = [s.path, bosidx.index_path(s.path)]
        assert s.files == tuple((p.stat().st_size, p.stat().st_ino, p.stat().st_mtime_ns) for p in files)


@pytest.mark.parametrize("damage, message", [
    ("id", r"piece-000001\.bin: token 3 is id 1000, not below the vocabulary size 1000$"),
    ("no-bos", r"piece-000001\.bin: the document starting at token 0 has no entry|"
               r"piece-000001\.bos\.idx: entry 0 points at token 0, which is not a document start"),
    ("lengths", r"piece-000001\.bos\.idx: entry 1 points at token 2, which is not a document start \(BOS token 900"),
], ids=["id-past-the-vocabulary", "a-document-without-its-bos", "starts-not-at-the-bos"])
def test_a_shard_that_fails_its_checks_is_never_committed(tmp_path, damage, message):
    first, first_lengths = docs(3, 4)
    tokens, lengths = docs(5, 2)
    if damage == "id":
        tokens[3] = VOCAB
    elif damage == "no-bos":
        tokens[0] = 7
    else:  # the lengths say the documents are 2 and 5 tokens: the second "starts" at an ordinary id
        lengths = [2, 5]
    with pytest.raises(ValidationError, match=message):
        with unit_writer(tmp_path, context()) as w:
            w.write(first, first_lengths)  # one full shard: committed
            w.write(tokens, lengths)  # the next: refused when it is cut
            w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["piece-000000.bin", "piece-000000.bos.idx"]


def test_eos_placement_needs_the_eos_at_every_document_end(tmp_path):
    ctx = context("eos", boundary=5, eos=5)
    with pytest.raises(ValidationError, match=r"piece-000000\.bin: its last token is 3, not the EOS token 5"):
        with unit_writer(tmp_path, ctx) as w:
            w.write(np.array([1, 2, 5, 1, 3], dtype=DTYPE), [3, 2])
            w.close()
    assert list(tmp_path.iterdir()) == []


class CountOffByOne(NanoGPTFormat):
    """A header that says one token fewer than the shard holds."""

    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        return super().header(max(0, ntokens - 1), dtype)


@pytest.mark.parametrize("ntokens", [5, None], ids=["header-first", "header-last"])
def test_a_header_that_does_not_say_what_was_written_is_never_committed(tmp_path, ntokens):
    fmt = CountOffByOne(name="nanogpt", magic=NANOGPT.header_magic, records_width=True)
    with pytest.raises(ValidationError, match=r"s\.bin: the header written says 4 tokens of uint16 .* but 5 tokens"):
        with ShardWriter(fmt, tmp_path / "s.bin", DTYPE, ntokens) as w:
            w.write(np.arange(5, dtype=DTYPE))
            w.commit()
    assert list(tmp_path.iterdir()) == []


class OneSequenceShort(MegatronFormat):
    """An ``.idx`` that leaves out the last document."""

    def sidecars(self, shard_path, ntokens, dtype, starts):
        return {idx_path(shard_path): encode_idx(int(starts[-1]), dtype, starts[:-1])}


def test_a_sidecar_that_does_not_read_back_as_the_documents_is_refused(tmp_path):
    starts = np.array([0, 3], dtype=np.int64)
    assert write_sidecars(MEGATRON, tmp_path / "good.bin", DTYPE, 5, starts)  # the real one reads back
    with pytest.raises(ValidationError, match=r"bad\.idx: sequence lengths add up to 3 tokens, the shard holds 5"):
        write_sidecars(OneSequenceShort(), tmp_path / "bad.bin", DTYPE, 5, starts)


def test_tokens_copied_into_a_shard_are_checked_as_they_pass(tmp_path):
    """A gathered shard's tokens come through ``copy_from`` (the units' pieces, the parent's ranges)."""
    tokens, lengths = docs(3, 4, 5)
    tokens[9] = 4000
    src = io.BytesIO(tokens.tobytes())
    src.name = "pieces"  # type: ignore[attr-defined]
    path = tmp_path / "s.bin"
    with pytest.raises(ValidationError, match=r"s\.bin: token 9 is id 4000, not below the vocabulary size 1000"):
        with ShardWriter(RAWBIN, path, DTYPE, len(tokens), check=ShardScan(context(), path, tmp_path / "s.bos.idx")) as w:
            w.copy_from(src, len(tokens), np.empty(4, dtype=DTYPE))  # three blocks: the bad id in the third
            w.commit()
    assert list(tmp_path.iterdir()) == []
