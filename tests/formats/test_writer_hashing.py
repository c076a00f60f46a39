"""The shard writer and the shard check hash on a helper thread (``_io.BackgroundSha256``) while
they read, write and check the next block: the digests must still be those of the bytes on disk,
whatever the block sizes, the number of pieces, and how a caller mixes ``copy_from`` and ``write``.
A writer not told the token count writes the header at commit: the same bytes and digest as one told it."""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardflow._io import BackgroundSha256
from shardflow.errors import ConfigError, ValidationError
from shardflow.formats import FORMATS, NANOGPT, RAWBIN, ShardFormat
from shardflow.formats.writer import ShardWriter

DTYPE = np.dtype("<u4")
MIB = 1 << 20


class SlowHash(BackgroundSha256):
    """Each block's hash starts late: a caller refilling a buffer too early changes what is hashed."""

    def update(self, data: object) -> None:
        self.wait()
        hash_update = self._hash.update

        def late() -> None:
            time.sleep(0.002)
            hash_update(data)

        self._busy = threading.Thread(target=late, daemon=True)
        self._busy.start()


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 17, MIB - 1, MIB, MIB + 3, 3 * MIB]), max_size=6))
def test_background_hash_is_the_hash_of_the_blocks_in_order(sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    blocks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    h = BackgroundSha256()
    for b in blocks:
        h.update(memoryview(b))
    assert h.hexdigest() == hashlib.sha256(b"".join(blocks)).hexdigest()


def test_a_block_may_be_reused_once_the_next_update_returns() -> None:
    """Two alternating buffers, refilled as the contract allows: the digest is of what was given."""
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 256, 2 * MIB, dtype=np.uint8) for _ in range(7)]
    buffers = (np.empty(2 * MIB, np.uint8), np.empty(2 * MIB, np.uint8))
    h = BackgroundSha256()
    for i, d in enumerate(data):
        buf = buffers[i % 2]
        buf[:] = d  # this buffer's previous block was hashed: the update before returned after it
        h.update(memoryview(buf))
    h.wait()
    buffers[0][:] = 0  # after wait() nothing is hashing any more
    assert h.hexdigest() == hashlib.sha256(b"".join(d.tobytes() for d in data)).hexdigest()


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.tuples(st.sampled_from(["copy", "write"]), st.integers(0, 300_000)), min_size=1, max_size=6),
    block=st.sampled_from([1000, 4096, 65_536, 100_003]),
)
def test_the_writer_digest_and_bytes_match_whatever_the_pieces(tmp_path: Path, pieces: list[tuple[str, int]], block: int) -> None:
    rng = np.random.default_rng(block)
    chunks = [rng.integers(0, 100_000, n, dtype=np.uint32).astype(DTYPE) for _, n in pieces]
    total = sum(len(c) for c in chunks)
    path = tmp_path / f"shard-{block}-{len(pieces)}.bin"
    buf = np.empty(block, dtype=DTYPE)  # one caller buffer for every copy, as write_shard passes
    w = ShardWriter(NANOGPT, path, DTYPE, total)
    w._hash = SlowHash()  # before the header: every block hashed late
    with w:
        for (how, _), chunk in zip(pieces, chunks):
            if how == "copy":
                src = io.BytesIO(chunk.tobytes())
                src.name = "part"  # type: ignore[attr-defined]
                w.copy_from(src, len(chunk), buf)
            else:
                arr = chunk.copy()
                w.write(arr)
                arr[:] = 0  # the caller may change its array once write() returns
        nbytes, digest = w.commit()
    raw = path.read_bytes()
    assert len(raw) == nbytes
    assert digest == hashlib.sha256(raw).hexdigest()
    header = NANOGPT.header(total, DTYPE)
    assert raw[: len(header)] == header
    assert raw[len(header):] == b"".join(c.tobytes() for c in chunks)


def test_a_short_source_still_fails_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    src = io.BytesIO(np.arange(10, dtype=DTYPE).tobytes())
    src.name = "unit-0.bin"  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="unit-0.bin: shorter than the layout says"):
        with ShardWriter(NANOGPT, path, DTYPE, 20) as w:
            w.copy_from(src, 20, np.empty(4, dtype=DTYPE))
    assert not path.exists() and not list(tmp_path.iterdir())


def test_blocks_start_their_writeback_as_they_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer hands every block of tokens (not the small header) to the kernel's writeback at once, so
    # that commit's fsync waits only for the last ones: the ranges are the blocks' own, end to end.
    import shardflow.formats.writer as writer

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(writer, "start_writeback", lambda fd, offset, nbytes: calls.append((offset, nbytes)) or True)
    block = (1 << 20) // DTYPE.itemsize  # the smallest block that starts its writeback
    data = np.arange(5 * block + 7, dtype=DTYPE)
    header = NANOGPT.header(len(data), DTYPE)
    src = io.BytesIO(data.tobytes())
    src.name = "part"  # type: ignore[attr-defined]
    with ShardWriter(NANOGPT, tmp_path / "s.bin", DTYPE, len(data)) as w:
        w.copy_from(src, len(data), np.empty(block, dtype=DTYPE))
        w.commit()
    nb = block * DTYPE.itemsize
    assert calls == [(len(header) + i * nb, nb) for i in range(5)]  # the 7-token tail is left to the fsync


def test_the_kernel_takes_a_writeback_request_for_a_regular_file_only(tmp_path: Path) -> None:
    import os
    import sys

    from shardflow._io import start_writeback

    import shardflow._io as io_

    with open(tmp_path / "f.bin", "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        took = start_writeback(f.fileno(), 0, 100_000)
        # Linux takes it, unless a sandbox refuses the call outright (then it is never made again).
        assert took is (sys.platform.startswith("linux") and io_._sync_file_range is not False)
        assert start_writeback(f.fileno(), 0, 0) is False
        assert start_writeback(f.fileno(), 10, 100) is False  # no whole page: left for the next call
    r, w = os.pipe()
    try:
        assert start_writeback(w, 0, 10) is False  # ESPIPE: no error raised, no head start
    finally:
        os.close(r)
        os.close(w)


def test_npy_headers_are_read_one_thread_at_a_time(tmp_path: Path) -> None:
    # numpy parses .npy headers with ast.literal_eval, which CPython 3.11.7 can fail when two threads
    # parse at once (gh-106905): the core reads them under _io.NPY_LOCK.
    from shardflow._io import NPY_LOCK, load_npy
    from shardflow.formats import get_format

    np.save(tmp_path / "a.npy", np.arange(5))
    shard = tmp_path / "s.npy"
    npy = get_format("npy")
    shard.write_bytes(npy.header(3, DTYPE) + np.arange(3, dtype=DTYPE).tobytes())
    done: list[object] = []
    with NPY_LOCK:
        readers = [threading.Thread(target=lambda: done.append(load_npy(tmp_path / "a.npy"))),
                   threading.Thread(target=lambda: done.append(npy.read_header(shard, DTYPE)))]
        for t in readers:
            t.start()
        time.sleep(0.3)
        assert done == []  # both wait for the lock
    for t in readers:
        t.join(timeout=10)
    assert len(done) == 2


# A writer opened without the count (ntokens=None) writes its header at commit: the same bytes and digest.

FORMAT_DTYPES = [
    (fmt, np.dtype(dt)) for fmt in FORMATS.values() for dt in ("<u2", "<u4") if fmt.name != "nanogpt-legacy" or dt == "<u2"
]


class ReadOpens:
    """Paths opened for reading while ``active`` (an audit hook; it cannot be removed, so it only ever collects)."""

    def __init__(self) -> None:
        self.active: list[str] | None = None
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if event == "open" and self.active is not None and isinstance(args[0], (str, Path)):
            if isinstance(args[1], str) and "r" in args[1]:
                self.active.append(Path(args[0]).name)


@functools.lru_cache(maxsize=1)
def read_opens() -> ReadOpens:
    return ReadOpens()


def write_twice(directory: Path, fmt: ShardFormat, dtype: np.dtype, chunks: list[np.ndarray], block: int) -> list[tuple[int, str]]:
    """Write ``chunks`` (alternately ``write`` and ``copy_from``) with a counted writer, then with one not told the count."""
    total = sum(len(c) for c in chunks)
    out = []
    for name, ntokens in (("counted", total), ("last", None)):
        buf = np.empty(block, dtype=dtype)
        with ShardWriter(fmt, directory / f"{name}.{fmt.extension}", dtype, ntokens) as w:
            for i, chunk in enumerate(chunks):
                if i % 2:
                    src = io.BytesIO(chunk.tobytes())
                    src.name = "part"  # type: ignore[attr-defined]
                    w.copy_from(src, len(chunk), buf)
                else:
                    w.write(chunk)
            assert w.written == total
            out.append(w.commit())
            assert w.ntokens == total and w.header == fmt.header(total, dtype)
    return out


@settings(max_examples=30, deadline=None)
@given(
    which=st.integers(0, len(FORMAT_DTYPES) - 1),
    sizes=st.lists(st.integers(0, 40_000), max_size=5),
    block=st.sampled_from([1000, 65_536]),
)
def test_a_header_written_last_gives_the_bytes_and_digest_of_a_counted_writer(which: int, sizes: list[int], block: int) -> None:
    fmt, dtype = FORMAT_DTYPES[which]
    rng = np.random.default_rng(len(sizes))
    chunks = [rng.integers(0, 60_000, n).astype(dtype) for n in sizes]
    body = b"".join(c.tobytes() for c in chunks)
    with tempfile.TemporaryDirectory() as d:
        counted, last = write_twice(Path(d), fmt, dtype, chunks, block)
        raw = (Path(d) / f"last.{fmt.extension}").read_bytes()
        assert raw == (Path(d) / f"counted.{fmt.extension}").read_bytes()
        assert raw == fmt.header(len(body) // dtype.itemsize, dtype) + body
        assert counted == last == (len(raw), hashlib.sha256(raw).hexdigest())
        assert sorted(p.name for p in Path(d).iterdir()) == sorted(f"{n}.{fmt.extension}" for n in ("counted", "last"))


@pytest.mark.parametrize("fmt", [NANOGPT, RAWBIN], ids=lambda f: f.name)
def test_only_a_header_written_last_reads_the_file_back_once(tmp_path: Path, fmt: ShardFormat) -> None:
    # A headerless format hashes the tokens as they pass; one with a header cannot before it knows the
    # header, so it reads the file back once at commit. A counted writer never reads its tokens back: a
    # format with a header opens the file once more, to parse the header written as a reader does
    # (``_check_header``, before the commit); a headerless one only stats it.
    data = np.arange(300_000, dtype=DTYPE)
    opens = read_opens()
    for ntokens in (len(data), None):
        opens.active = []
        with ShardWriter(fmt, tmp_path / f"s-{ntokens}.bin", DTYPE, ntokens) as w:
            w.write(data)
            w.commit()
        reads, opens.active = opens.active, None
        back = (fmt is NANOGPT) + (ntokens is None and fmt is NANOGPT)
        assert reads == [w.tmp.name] * back, (fmt.name, ntokens)


def test_the_read_back_digest_holds_across_many_blocks_hashed_late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back alternates two buffers like copy_from: a block refilled too early would change the digest."""
    import shardflow.formats.writer as writer

    monkeypatch.setattr(writer, "_READBACK_BYTES", MIB)  # hashed on the helper thread, 5 blocks and a piece
    data = np.random.default_rng(3).integers(0, 100_000, 5 * MIB // 4 + 77, dtype=np.uint32).astype(DTYPE)
    w = ShardWriter(NANOGPT, tmp_path / "s.bin", DTYPE)
    w._hash = SlowHash()
    with w:
        w.write(data[:1000])
        w.write(data[1000:])
        nbytes, digest = w.commit()
    raw = (tmp_path / "s.bin").read_bytes()
    assert raw == NANOGPT.header(len(data), DTYPE) + data.tobytes()
    assert (nbytes, digest) == (len(raw), hashlib.sha256(raw).hexdigest())


def test_more_tokens_than_the_header_records_fail_at_commit_and_leave_nothing(tmp_path: Path) -> None:
    small = copy.copy(NANOGPT)
    small.max_tokens = 10  # the int32 count's limit, lowered to a testable size
    with pytest.raises(ConfigError, match="11 tokens do not fit one shard"):
        with ShardWriter(small, tmp_path / "s.bin", DTYPE) as w:
            w.write(np.arange(11, dtype=DTYPE))
            w.commit()
    assert list(tmp_path.iterdir()) == []


class GrowingHeader(ShardFormat):
    """A format whose header is as long as the count's digits: it cannot be reserved before the count is known."""

    name = "growing"
    extension = "bin"

    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        return str(ntokens).encode()

    def read_header(self, path: Path, dtype: np.dtype | None) -> tuple[int, int, np.dtype]:
        dt = np.dtype(dtype)
        data = Path(path).read_bytes()
        for digits in range(1, 20):  # the count whose digits begin the file and whose tokens fill the rest
            n = (len(data) - digits) // dt.itemsize
            if len(str(n)) == digits and data[:digits] == str(n).encode():
                return digits, n, dt
        raise ValidationError(f"{path}: no count")


def test_a_header_whose_length_follows_the_count_needs_the_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="format 'growing': the header's length depends on the token count"):
        ShardWriter(GrowingHeader(), tmp_path / "s.bin", DTYPE)
    with ShardWriter(GrowingHeader(), tmp_path / "s.bin", DTYPE, 3) as w:  # told the count: as before
        w.write(np.arange(3, dtype=DTYPE))
        w.commit()
    assert (tmp_path / "s.bin").read_bytes() == b"3" + np.arange(3, dtype=DTYPE).tobytes()
