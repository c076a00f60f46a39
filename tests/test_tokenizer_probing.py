"""``probing.Probed``: the characters gigatoken classes unlike the reference, probed a block at a time as met.

A stand-in pair of backends (ids = code points; the "fast" one spells its disputed characters otherwise)
shows what is probed, and when, by counting (``Probed.probed``, the reference's calls): only the blocks
the documents bring, each once per machine (the cache file), never from another key's file. The real
tokenizer.json of the tokenizer-file tests shows the same through ``load_tokenizer``, in a new process's
stead (a copy of the file at a new path: nothing of the first load is reused but the cache on disk).
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.corpus import write_parquet
from shardflow.tokenizers import load_tokenizer, routing
from shardflow.tokenizers.probing import CANDIDATE_BLOCKS, EAGER_BLOCKS, Probed

DISPUTED = {0x0C5C, 0xA7CE, 0x323B0}  # a Telugu letter, a Latin one, CJK Extension J: new in Unicode 16-17
WHOLE = 0x1D400 >> 7  # a block whose characters differ only together (in a block's text), never alone
CANDIDATES = sum(hi - lo for lo, hi in CANDIDATE_BLOCKS)


class Fast:
    """gigatoken's stand-in: a disputed character is id 0; a long text holding a character of ``WHOLE`` gets one more id."""

    def encode_batch_list(self, texts):
        out = []
        for t in texts:
            ids = [0 if ord(c) in DISPUTED else ord(c) for c in t]
            out.append(ids + [1] if len(t) > 100 and any(ord(c) >> 7 == WHOLE for c in t) else ids)
        return out


class Reference:
    """The reference's stand-in: each character's code point; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, texts):
        self.calls += 1
        return [[ord(c) for c in t] for t in texts]


def _probed(key=None):
    reference = Reference()
    return Probed(Fast(), reference, key=key, name="t", library="ref"), reference


def _docs(*texts):
    return pa.array(list(texts), type=pa.large_string())


def test_only_the_blocks_the_documents_bring_are_probed_each_once():
    probed, reference = _probed()
    assert probed.probed == EAGER_BLOCKS and probed.pending == CANDIDATES - EAGER_BLOCKS  # U+0000-07FF when made
    reference.calls = 0
    assert probed.hits(_docs("plain text", "é ü ß", "")).tolist() == []
    assert (probed.probed, reference.calls) == (EAGER_BLOCKS, 0)  # their blocks are probed already
    assert probed.hits(_docs("中", "x", "\u4e2e and \ua7ce")).tolist() == [2]
    assert probed.probed == EAGER_BLOCKS + 2  # U+4E00-4E7F and U+A780-A7FF
    calls = reference.calls
    assert probed.hits(_docs("\u4e2d", "\ua7ce")).tolist() == [1]
    assert (probed.probed, reference.calls) == (EAGER_BLOCKS + 2, calls)  # nothing new: nothing probed
    # A block that differs while none of its characters does alone is disputed whole, as a probe of every block says.
    assert probed.hits(_docs("\U0001d400 bold", "\U0001d47f", "\U0001d480")).tolist() == [0, 1]
    assert probed.code_points == (0xA7CE, *range(WHOLE << 7, (WHOLE + 1) << 7))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(["a", " ", "é", "\u0c5c", "\u0c5b", "\ua7ce", "\u20ac", "\U0001f642", "\U000323b0",
                                          "\U00032000", "\U000e0041", "\U000f0000"]), max_size=12),
        max_size=8,
    ),
    st.integers(0, 3),
    st.booleans(),
)
def test_hits_are_the_documents_holding_a_disputed_character(docs, start, large):
    """The byte-level scan, probing as it goes, finds exactly the documents holding a disputed character, in sliced
    arrays too (private use, U+F0000, is no candidate: never probed, never disputed)."""
    array = pa.array(docs, type=pa.large_string() if large else pa.string()).slice(min(start, len(docs)))
    expected = [i for i, d in enumerate(array.to_pylist()) if any(ord(c) in DISPUTED for c in d)]
    assert _SHARED.hits(array).tolist() == expected


_SHARED = _probed()[0]


@pytest.mark.parametrize("every", [97, 3])
def test_hits_in_a_large_batch_are_those_of_a_python_scan(every):
    """Batches of many KiB: rows with no byte of a 3- or 4-byte character are skipped (one document in 97 holds
    one), or, where many rows hold one (one in 3), every byte is compared; characters across a row's end included."""
    import random

    rng = random.Random(every)
    docs = []
    for i in range(400):
        words = ["x" * rng.randrange(1, 40) for _ in range(rng.randrange(5, 60))]
        if i % every == 0:
            words.insert(rng.randrange(len(words) + 1), rng.choice(["\u4e2d", "\U000323b0", "\ua7ce", "\U0001f642", "\u0c5c"]))
        docs.append(" ".join(words))
    array = pa.array(docs, type=pa.large_string())
    assert len(array.buffers()[2]) > 16 * 1024
    expected = [i for i, d in enumerate(docs) if any(ord(c) in DISPUTED for c in d)]
    assert expected and _SHARED.hits(array).tolist() == expected
    assert _SHARED.hits(array.slice(5)).tolist() == [i - 5 for i in expected if i >= 5]


def test_a_new_process_probes_no_block_the_machine_has_probed(tmp_path, monkeypatch):
    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path))
    first, _ = _probed("sha256-of-the-file tokenizers 0.23")
    first.hits(_docs("\u4e2d", "\U000323b0's"))
    assert first.probed == EAGER_BLOCKS + 2 and len(list(tmp_path.glob("blocks-*.json"))) == 1
    second, reference = _probed("sha256-of-the-file tokenizers 0.23")  # another process on this machine
    assert second.probed == 0 and reference.calls == 0
    assert second.hits(_docs("x", "\U000323b0", "\u4e2e")).tolist() == [1]
    assert second.probed == 0 and reference.calls == 0 and second.code_points == (0x323B0,)
    # What each process probes is added to the file, not put in place of what another kept.
    second.hits(_docs("\u0c5c"))
    assert second.probed == 1
    third, reference = _probed("sha256-of-the-file tokenizers 0.23")
    assert third.code_points == (0x0C5C, 0x323B0) and third.hits(_docs("\u4e2d\u0c5c")).tolist() == [0]
    assert third.probed == 0 and reference.calls == 0


def test_the_cache_of_another_tokenizer_or_gigatoken_version_or_a_foreign_file_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path))
    first, _ = _probed("sha-a tokenizers 0.23")
    first.hits(_docs("\U000323b0"))
    assert _probed("sha-b tokenizers 0.23")[0].probed == EAGER_BLOCKS  # another file's SHA-256: all probed again
    version = routing.importlib.metadata.version
    monkeypatch.setattr(routing.importlib.metadata, "version", lambda name: "0.0.1" if name == "gigatoken" else version(name))
    assert _probed("sha-a tokenizers 0.23")[0].probed == EAGER_BLOCKS  # another gigatoken: another file
    monkeypatch.undo()
    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path))
    (path,) = [p for p in tmp_path.glob("blocks-*.json") if json.loads(p.read_text())["disputed"] == [0x323B0]]
    block = 0x323B0 >> 7
    for foreign in ("{not json", {"blocks": [block], "disputed": [0x41]}, {"blocks": [block, 0xF0000 >> 7], "disputed": []}):
        # damaged; claiming a character outside its blocks; holding a block that is no candidate
        path.write_text(foreign if isinstance(foreign, str) else json.dumps(foreign))
        again, _ = _probed("sha-a tokenizers 0.23")
        assert again.probed == EAGER_BLOCKS and again.hits(_docs("A", "\U000323b0")).tolist() == [1]


def test_a_copy_of_the_tokenizer_json_elsewhere_reads_the_blocks_probed_and_an_edited_one_does_not(bpe_json, tmp_path, monkeypatch):
    """Through ``load_tokenizer``: a copy at a new path is loaded anew (a worker process's first load), finds its
    blocks in the cache by the file's SHA-256, and encodes as the reference; an edited file probes its own."""
    monkeypatch.setenv(routing.CACHE_ENV, str(tmp_path / "cache"))
    docs = ["plain words", "中文字符 and \U000323b0's", "\u0c5c's", "emoji \U0001f642"]
    reference = load_tokenizer(str(bpe_json), backend="hf")
    expected = [reference.encode_ordinary(d) for d in docs]

    def load(name, text):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(text)
        tok = load_tokenizer(str(tmp_path / name / "tokenizer.json"), backend="gigatoken")
        tokens, offsets = tok.encode_batch(docs)
        assert [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(docs))] == expected
        return tok._routed

    text = bpe_json.read_text()
    first = load("a", text)
    assert first.probed > EAGER_BLOCKS
    assert load("b", text).probed == 0  # every block met was probed by the first load
    assert load("c", text + "\n").probed == first.probed  # another SHA-256: its own probe, nothing read


def test_planning_and_the_units_load_the_tokenizer_once(bpe_json, built, sample_texts, tmp_path, monkeypatch):
    """A build's plan, its units (two inputs, two threads), its statistics and its publish use one load of the tokenizer."""
    from shardflow.tokenizers import HF

    inputs = [write_parquet(tmp_path / "in" / f"{i}.parquet", sample_texts[i::2]) for i in range(2)]
    copy = tmp_path / "tok" / "tokenizer.json"  # a path no earlier test loaded
    copy.parent.mkdir()
    shutil.copyfile(bpe_json, copy)
    loads = []
    load = type(HF).load
    monkeypatch.setattr(type(HF), "load", lambda self, name, backend: loads.append((name, backend)) or load(self, name, backend))
    result = built(inputs, workers=2, tokenizer=str(copy))
    assert loads == [(str(copy), "auto")]
    assert len(result.open().manifest.inputs) == 2 and result.open().manifest.tokenized_info["backend"] == "gigatoken"
