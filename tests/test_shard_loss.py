"""The shard-end loss arithmetic of bench/bench_shard_loss.py: each trainer reader's rule on hand-made shards.

modded-nanogpt's rule is vectorized there; here it is checked against a literal
transcription of its loader's loop (``BOSFinder.next_batch`` in
``train_gpt.py``: rank by rank, BOS-started pieces cut at the next BOS,
``max_seq_len`` or the rank's end; out of BOS positions mid-batch, the shard's
rest is dropped). The other rules are checked on numbers worked out by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from shardflow.targets import TARGETS

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_shard_loss.py"
_spec = importlib.util.spec_from_file_location("bench_shard_loss", BENCH)
loss = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = loss  # dataclasses look their module up while the class is made
_spec.loader.exec_module(loss)


def bosfinder_tail(bos: list[int], size: int, ranks: int, rank_tokens: int, max_seq_len: int | None) -> int:
    """Tokens of a shard modded-nanogpt's loader leaves when it moves to the next shard, its loop as written."""
    cap = max_seq_len if max_seq_len is not None else size + 1
    n = len(bos)
    i = 0
    while True:
        idx = i
        for _ in range(ranks):
            cur_len = 0
            while cur_len <= rank_tokens:
                if idx >= n:  # StopIteration: "Insufficient BOS ahead; hit tail of shard."
                    head = bos[0] if bos else size  # before the first BOS: a continued document, never read
                    return head + (size - bos[i] if i < n else 0)
                cur = bos[idx]
                end = min(bos[idx + 1] if idx + 1 < n else size, cur + cap, cur + rank_tokens - cur_len + 1)
                cur_len += end - cur
                idx += 1
            assert cur_len == rank_tokens + 1
        i = idx


def test_modded_nanogpt_matches_its_loader_loop():
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(60):
        lengths = rng.integers(1, 400, size=int(rng.integers(1, 60)))
        head = int(rng.integers(0, 30)) if trial % 3 == 0 else 0  # a shard that begins mid-document
        bos = (head + np.concatenate(([0], np.cumsum(lengths)[:-1]))).tolist()
        size = head + int(lengths.sum())
        for ranks, rank_tokens, cap in ((1, 50, None), (2, 100, 64), (8, 16, 7), (3, 300, None)):
            want = bosfinder_tail(bos, size, ranks, rank_tokens, cap)
            got = loss.modded_nanogpt_lost(size, np.array(bos), ranks=ranks, rank_tokens=rank_tokens, max_seq_len=cap)
            assert got == want, (trial, ranks, rank_tokens, cap)
            checked += 0 < want < size  # a partial tail, not only whole shards or nothing
    assert checked > 20


def test_modded_nanogpt_by_hand():
    # Documents of 2, 5, 2 and 3 tokens; 2 ranks of 4 + 1 tokens, pieces cut at 3: one batch takes
    # documents 0-1 (2 + 3) and 2-3 (2 + 3): all of them, nothing left at the end.
    assert loss.modded_nanogpt_lost(12, np.array([0, 2, 7, 9]), ranks=2, rank_tokens=4, max_seq_len=3) == 0
    # Uncapped, document 1 fills rank 0 (2 + 3 of its 5), documents 2-3 rank 1: still all.
    assert loss.modded_nanogpt_lost(12, np.array([0, 2, 7, 9]), ranks=2, rank_tokens=4, max_seq_len=None) == 0
    # 3 ranks need 15 tokens of pieces; the shard has 12: smaller than one batch, skipped whole.
    assert loss.modded_nanogpt_lost(12, np.array([0, 2, 7, 9]), ranks=3, rank_tokens=4, max_seq_len=None) == 12
    # 1 rank of 5: batch 1 = documents 0-1, batch 2 = documents 2-3 (2 + 3); then 4 tokens at 12.. are left.
    assert loss.modded_nanogpt_lost(16, np.array([0, 2, 7, 9, 12]), ranks=1, rank_tokens=4, max_seq_len=None) == 4
    # No document starts in it at all (one continued document): nothing can be read.
    assert loss.modded_nanogpt_lost(9, np.array([], dtype=np.int64), ranks=1, rank_tokens=4, max_seq_len=None) == 9


def test_nemo_by_hand():
    # Windows of seq_len + 1 = 5 at BOS 0 (0-5), then the first BOS at or after 5: 9 (9-14), then 15 (15-20).
    assert loss.nemo_lost(20, np.array([0, 3, 9, 15]), seq_len=4) == 0
    # One token fewer: no window fits at 15, so 14..19 is dropped.
    assert loss.nemo_lost(19, np.array([0, 3, 9, 15]), seq_len=4) == 5
    # A continued document's 2 tokens before the first BOS are dropped too: 2 + (19 - 14).
    assert loss.nemo_lost(19, np.array([2, 9]), seq_len=4) == 7
    assert loss.nemo_lost(4, np.array([0]), seq_len=4) == 4  # no window fits at all


def test_fixed_window_readers_by_hand():
    # KempnerForge: windows of seq_len + 1; OLMo-core: windows of sequence_length; per file.
    assert [loss.remainder_lost(n, 2049) for n in (5000, 2049, 100)] == [902, 0, 100]
    # Megatron: (n - 1) // 4096 samples of 4097 tokens, consecutive ones sharing one.
    assert [loss.megatron_lost(n, 4096) for n in (4097, 4096, 10_000, 8193)] == [0, 4096, 1807, 0]


def test_split_loss_against_one_file():
    rule = loss.rules(loss.ReaderDefaults(kempnerforge_seq_len=9))["kempnerforge"]
    row = loss.split_loss(rule, [25, 25, 3], [np.empty(0, dtype=np.int64)] * 3)
    # Windows of 10: each 25-token shard leaves 5, the 3-token one is lost whole; as one file 53 % 10 = 3.
    assert (row["lost"], row["lost_as_one_file"], row["shards_lost_whole"], row["tokens"]) == (13, 3, 1, 53)
    assert row["percent"] == pytest.approx(100 * 13 / 53)


def test_every_target_has_a_rule():
    assert set(loss.rules(loss.ReaderDefaults())) == set(TARGETS)
