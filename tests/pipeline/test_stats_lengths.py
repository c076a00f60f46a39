"""Length statistics summed from the work units' records: what the shards' own ``.bos.idx`` lengths give.

Every expected number is computed here from the published shards' ``.bos.idx``
files (raw int32 document starts), not by shardflow's statistics code. The
builds run on a real Parquet corpus (``make_corpus.py``), cut into several
work units per input so that each input's statistics are a sum of units'.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support.builds import make_builder
from support.paths import MAKE_CORPUS
from shardflow.pipeline import build_lock, make_layout, plan_build
from shardflow.pipeline.card_stage import draw_card
from shardflow.pipeline.doc_lengths import range_stats, sum_ranges
from shardflow.pipeline.staging import Staging
from shardflow.pipeline.tokenize import tokenize_unit
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.manifest import read_manifest

OPTIONS = dict(val_fraction=0.15, seed=3, shard_tokens=30_000, unit_bytes=60_000, card=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    out = tmp_path_factory.mktemp("lengths-corpus")
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(out), "--mb", "0.5", "--files", "3", "--rows-per-group", "16"],
                   check=True, capture_output=True)
    return sorted(out.glob("*.parquet"))


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    return make_builder(tmp_path_factory.mktemp("lengths"))([str(p) for p in corpus], name="len", workers=2, **OPTIONS)


def _split_lengths(directory: Path, split: str) -> np.ndarray:
    """Every document's length in ``split``, in order: from the raw ``.bos.idx`` starts and the shard sizes."""
    m = read_manifest(directory)
    lengths = []
    for shard in m.splits[split].shards:
        starts = np.fromfile(directory / shard.index.file, dtype="<i4").astype(np.int64)
        lengths.append(np.diff(np.append(starts, shard.tokens)))
    return np.concatenate(lengths)


def _lower_edge(length: int) -> int:
    # The bin of L is the largest k with floor(2**(k/4)) <= L, i.e. 2**(k/4) < L + 1.
    k = math.ceil(4 * math.log2(length + 1)) - 1
    return math.floor(2 ** (k / 4))


def _expected(lengths: np.ndarray) -> dict:
    """What ``stats.json`` should say of documents of these lengths, computed in plain Python."""
    values = [int(n) for n in lengths]
    return {
        "documents": len(values),
        "tokens": sum(values),
        "short_documents": sum(n <= 3 for n in values),
        "long_documents": sum(n >= 1 << 17 for n in values),
        "min_length": min(values, default=0),
        "max_length": max(values, default=0),
        "histogram": [[edge, count] for edge, count in sorted(Counter(_lower_edge(n) for n in values).items())],
    }


def test_each_inputs_length_statistics_are_those_of_its_documents_in_the_shards(built, corpus, tmp_path):
    plan = plan_build(BuildConfig(name="len", sources=tuple(map(str, corpus)), **OPTIONS),
                      data_root=tmp_path / "data", catalog=tmp_path / "cat")
    # Several units, and inputs of several: each input's statistics below are a sum of units' records.
    assert len(plan.units) >= 3 and max(Counter(u.input for u in plan.units).values()) >= 2
    d = built.directory
    m, stats = read_manifest(d), json.loads((d / "stats.json").read_text())
    assert set(m.splits) == {"train", "val"}
    for split in m.splits:
        lengths = _split_lengths(d, split)
        assert len(lengths) == m.splits[split].documents
        for inp, item in zip(m.inputs, stats["inputs"], strict=True):
            rng = inp["splits"][split]
            part = lengths[rng["first_document"] : rng["first_document"] + rng["documents"]]
            assert item["splits"][split] == _expected(part), (split, inp["relname"])
        assert all(len(i["splits"][split]["histogram"]) > 1 for i in stats["inputs"])  # not a trivial equality


def test_summing_records_gives_the_statistics_of_all_their_documents(built):
    lengths = np.concatenate([_split_lengths(built.directory, s) for s in ("train", "val")])
    odd = np.array([1, 3, 1 << 17, (1 << 17) + 5, 2, 4], dtype=np.int64)  # near-empty and huge documents
    everything = np.concatenate([lengths, odd])
    n = len(lengths)
    # Random cuts; near-empty documents in three records, the huge ones alone in one; and a repeated
    # cut: a record of no documents.
    cuts = sorted({*np.random.default_rng(0).choice(n, 9).tolist(), 17, n, n + 1, n + 2, n + 4})
    bounds = [0, *cuts, cuts[-1], len(everything)]
    # Through JSON, as the units' statistics files hold them.
    parts = json.loads(json.dumps([range_stats(everything[a:b]) for a, b in zip(bounds, bounds[1:])]))
    assert any(p["documents"] == 0 for p in parts) and any(p["min_length"] >= 1 << 17 for p in parts)
    assert sum(p["short_documents"] > 0 for p in parts) >= 3
    expected = _expected(everything)
    assert range_stats(everything) == expected
    assert sum_ranges(parts) == expected
    assert sum_ranges(parts[::-1]) == expected
    assert sum_ranges([]) == range_stats(np.empty(0, dtype=np.int64)) == _expected(np.empty(0))


def test_the_statistics_need_no_document_table_nor_document_starts(built, corpus, tmp_path):
    config = BuildConfig(name="len", sources=tuple(map(str, corpus)), **OPTIONS)
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    staging = Staging(plan.staging)
    with build_lock(plan) as plan:
        for u in range(len(plan.units)):
            tokenize_unit(plan, u)
        make_layout(plan)
        # What holds one entry per document: the layout's document starts, each unit's document table.
        for path in staging.layout_dir.glob("*.starts.i64"):
            path.unlink()
        for u in range(len(plan.units)):
            staging.unit_files(u)[1].write_bytes(b"")
        draw_card(plan)
        assert (staging.out / "stats.json").read_bytes() == (built.directory / "stats.json").read_bytes()

        # A unit's statistics file without its length records (another version's): one message, what to do.
        unit_stats = staging.unit_files(0)[0].with_suffix(".stats.npz")
        with np.load(unit_stats) as z:
            kept = {name: z[name] for name in z.files if name != "lengths"}
        buf = io.BytesIO()
        np.savez(buf, **kept)
        unit_stats.write_bytes(buf.getvalue())
        staging.card_file.unlink()
        message = r"part-00000.parquet record no document lengths of split '(train|val)'.*delete .* and build again"
        with pytest.raises(ConfigError, match=message):
            draw_card(plan)
