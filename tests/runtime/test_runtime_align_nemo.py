"""NeMo's BOS-alignment rule (``align_rule="nemo"``) against shardflow's, on hand-made document starts."""

from __future__ import annotations

import numpy as np
import pytest

from shardflow.runtime.dataset import aligned_starts


def test_nemo_rule_starts_the_next_sample_one_token_later():
    starts = np.array([0, 4, 5, 9])
    # seq_len 4, window 5: shardflow's next start is the first document start >= s + 4 (sharing the one token
    # that is one sample's last label and the next one's first input); NeMo's is the first >= s + 5.
    assert aligned_starts(starts, 14, 4).tolist() == [0, 4, 9]
    assert aligned_starts(starts, 14, 4, rule="nemo").tolist() == [0, 5]
    # Where no start falls on s + seq_len exactly, both agree.
    assert aligned_starts(np.array([0, 6, 12]), 20, 4, rule="nemo").tolist() == aligned_starts(np.array([0, 6, 12]), 20, 4).tolist()


def test_nemo_rule_is_only_for_overflow_skip(sample_built):
    from shardflow.runtime import TokenDataset

    with pytest.raises(ValueError, match=r"align_rule='nemo' cuts documents as NeMo does: use it with overflow='skip'"):
        TokenDataset(str(sample_built.directory), seq_len=64, align_to_bos=True, overflow="continue", align_rule="nemo")
    with pytest.raises(ValueError, match=r"align_rule must be 'shardflow' or 'nemo', not 'x'"):
        TokenDataset(str(sample_built.directory), seq_len=64, align_to_bos=True, align_rule="x")
    nemo = TokenDataset(str(sample_built.directory), seq_len=64, align_to_bos=True, align_rule="nemo")
    ours = TokenDataset(str(sample_built.directory), seq_len=64, align_to_bos=True)
    assert 0 < len(nemo) <= len(ours) and nemo.fingerprint["align_rule"] == "nemo" and "align_rule" not in ours.fingerprint
