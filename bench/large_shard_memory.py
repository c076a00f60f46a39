"""Write one shard of more than 2**31 tokens (nanoGPT's one ``train.bin``) and report the peak memory.

Synthetic tokens through the writer API the build's write stage uses
(``ShardWriter.copy_from`` through one bounded buffer, ``encode_index`` /
``write_index`` for the ``.bos.idx``), so the figure is the writer's, not a
tokenizer's. The index gets int64 entries (the shard is past 2**31 - 1
tokens); it is read back through ``bosidx.read`` and checked, and the
runtime's BOS-aligned ``TokenDataset`` opens the files as a plain directory
(after the peak is taken) and must start its last sample, past token 2**31,
right after an EOS. Needs about
2 x tokens bytes of disk (uint16) in ``--dir``; the files are deleted after.

    /usr/bin/time -v python bench/large_shard_memory.py --tokens 3000000000 --dir /tmp/large [--read-check]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import time
from pathlib import Path

import numpy as np

from shardflow.formats import RAWBIN, bosidx
from shardflow.formats.writer import ShardWriter, encode_index, write_index
from shardflow.runtime import TokenDataset

BLOCK = 16 << 20  # the write stage's _BLOCK_TOKENS
_FILL = 1 << 18


class _Synthetic:
    """A file-like source of ``uint16`` tokens: ids cycling below 50257, an EOS (50256) every ``doc`` tokens."""

    name = "<synthetic>"

    def __init__(self, doc: int) -> None:
        self.pos = 0
        self.doc = doc

    def readinto(self, view: memoryview) -> int:
        out = np.frombuffer(view, dtype="<u2")
        for a in range(0, len(out), _FILL):  # small pieces: the generator's scratch must not hide the writer's memory
            idx = np.arange(self.pos + a, self.pos + min(a + _FILL, len(out)), dtype=np.int64)
            piece = out[a : a + len(idx)]
            piece[:] = idx % 50_000
            piece[(idx + 1) % self.doc == 0] = 50_256
        self.pos += len(out)
        return len(view)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=3_000_000_000)
    p.add_argument("--doc", type=int, default=1000, help="tokens per synthetic document")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--read-check", action="store_true", help="also open the files with the runtime's TokenDataset")
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "train.bin"
    dtype = np.dtype("<u2")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # after the imports
    t0 = time.perf_counter()
    try:
        buf = np.empty(min(BLOCK, args.tokens), dtype=dtype)
        with ShardWriter(RAWBIN, path, dtype, args.tokens) as writer:
            writer.copy_from(_Synthetic(args.doc), args.tokens, buf)  # type: ignore[arg-type]
            nbytes, _ = writer.commit()
        written = time.perf_counter() - t0
        # Document starts: 0 and after every EOS (the write stage reads them from the layout's int64 file).
        starts = np.arange(0, args.tokens, args.doc, dtype=np.int64)
        data, _ = encode_index(starts, args.tokens)
        write_index(bosidx.index_path(path), data)
        del data
        back = bosidx.read(bosidx.index_path(path), args.tokens)
        width = bosidx.entry_dtype(args.tokens)  # int64 past 2**31 - 1 tokens
        assert back.dtype == width and np.array_equal(back, starts), "the index did not read back"
        tokens = RAWBIN.open(path, dtype)
        assert len(tokens) == args.tokens and int(tokens[int(back[-1]) - 1]) == 50_256
        del tokens
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"tokens={args.tokens:,} shard={nbytes / 1e9:.2f} GB index={bosidx.index_path(path).stat().st_size / 1e6:.1f} MB "
            f"({len(back):,} {width.name} entries, last {int(back[-1]):,}) write={written:.1f} s peak_rss={peak:.0f} MiB "
            f"(after imports: {base:.0f} MiB)"
        )
        if not args.read_check:
            return
        # The runtime on the same files, as a plain directory (no monkeypatched limit here): BOS-aligned
        # samples past token 2**31 must start right after an EOS. A plain directory's index is checked
        # against the tokens (ShardSet._check_index), which maps every page of the shard: the process's
        # RSS then includes the file's cached pages, so this runs after the peak above is taken.
        ds = TokenDataset(
            str(args.dir), dtype="uint16", format="bin", boundary="eos", boundary_token=50_256, seq_len=1024, align_to_bos=True
        )
        last = len(ds) - 1
        k, at = ds.locate(last)
        assert at % args.doc == 0 and at + 1025 > args.tokens - 2 * args.doc and int(RAWBIN.open(path, dtype)[at - 1]) == 50_256
        assert ds[last]["input_ids"][0] == at % 50_000
        print(f"TokenDataset(align_to_bos=True, seq_len=1024): {len(ds):,} samples, the last at token {at:,}")
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
