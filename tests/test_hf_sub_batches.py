"""The tokenizer.json family's reference path (``--backend hf``) encodes in sub-batches and keeps only ids.

Issue 44 item 5: the tokenizers library returns one ``Encoding`` per document (ids, type ids,
token strings, offsets, masks: about 70 bytes a token); a batch encoded in one call held all of
them. ``HFTokenizer.encode_batch`` on the reference backend now calls the library on
``SUB_BATCH_BYTES`` of text at a time and keeps each sub-batch's ids as one array. Checked here:

* the ids are the library's, document for document, for every input form the build and the
  callers pass (lists, Arrow string and large-string arrays, sliced and chunked ones), with
  sub-batches of a few hundred bytes (so a document larger than one is a call of its own),
  and equal to one call for the whole batch;
* each library call gets at most ``SUB_BATCH_BYTES`` of text (or one document), every document
  once and in order, and while one call runs the ``Encoding`` objects of at most two earlier ones
  are alive (the next sub-batch is encoded while the ids of one are copied out);
* in a fresh process, the peak memory of encoding 10 MB of text is a fraction of one call's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from support import tokenizer_files
from support.paths import CORPORA
from shardflow.tokenizers import hf_family, load_tokenizer

EXTRA = ["", "é\u0301 中文 \U0001f642", "<|begin_of_text|> <s>", "x" * 2000, "", "    def f(x):\n        return x\n"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    if not CORPORA.is_dir():
        pytest.skip(f"{CORPORA} is not available")
    docs = tokenizer_files.corpus_documents()
    return [*EXTRA[:3], *(d[:3000] for d in docs[:40]), *EXTRA[3:]]


@pytest.fixture(params=["llama3", "bpe"])
def tokenizer_path(request: pytest.FixtureRequest) -> Path:
    if request.param == "llama3":
        return request.getfixturevalue("llama3_dir")
    return request.getfixturevalue("bpe_json")


def _reference(tok: Any, texts: list[str]) -> list[list[int]]:
    """The library's ids of each text, one ``encode`` call each (what ``encode_ordinary`` is)."""
    return [tok.encode_ordinary(t) for t in texts]


def _split(tokens: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def _forms(texts: list[str]) -> dict[str, Any]:
    padded = pa.array(["before", *texts, "after"], type=pa.string())
    return {
        "list": list(texts),
        "tuple": tuple(texts),
        "string": pa.array(texts, type=pa.string()),
        "large_string": pa.array(texts, type=pa.large_string()),
        "sliced": padded.slice(1, len(texts)),  # an array with a non-zero offset
        "chunked": pa.chunked_array([pa.array(texts[:7], pa.large_string()), pa.array(texts[7:], pa.large_string())]),
    }


def test_sub_batches_give_the_reference_ids_for_every_input_form(tokenizer_path, texts, monkeypatch):
    tok = load_tokenizer(str(tokenizer_path), backend="hf")
    assert tok.backend == "hf"
    expected = _reference(tok, texts)
    whole_tokens, whole_offsets = tok.encode_batch(texts)  # one call: the batch is under SUB_BATCH_BYTES
    assert _split(whole_tokens, whole_offsets) == expected
    monkeypatch.setattr(hf_family, "SUB_BATCH_BYTES", 300)
    for name, form in _forms(texts).items():
        tokens, offsets = tok.encode_batch(form)
        assert tokens.dtype == np.uint32 and offsets.dtype == np.int64, name
        assert np.array_equal(tokens, whole_tokens) and np.array_equal(offsets, whole_offsets), name
    assert tok.reference_batch(texts) == expected
    for empty in ([], pa.array([], pa.large_string()), pa.chunked_array([], pa.string())):
        tokens, offsets = tok.encode_batch(empty)
        assert tokens.dtype == np.uint32 and len(tokens) == 0 and offsets.tolist() == [0]


class _Spy:
    """A tokenizers.Tokenizer whose ``encode_batch_fast`` records each call and which calls' ``Encoding`` objects
    are alive (the library is called on a thread of its own, while the caller copies out the ids of earlier calls)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.calls: list[list[str]] = []
        self.alive_at_call: list[set[int]] = []  # at each call, the earlier calls whose Encodings were alive
        self.held: Counter[int] = Counter()
        self.lock = threading.Lock()

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list[Any]:
        with self.lock:
            self.alive_at_call.append({call for call, n in self.held.items() if n})
            self.calls.append(list(texts))
            call = len(self.calls) - 1
        return [_Held(self, call, e) for e in self.ref.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]

    encode_batch = encode_batch_fast  # the family's fallback name for libraries without encode_batch_fast

    @property
    def alive(self) -> int:
        return sum(self.held.values())


class _Held:
    """One ``Encoding``, counted while it is referenced."""

    def __init__(self, spy: _Spy, call: int, encoding: Any) -> None:
        self.spy, self.call, self.ids = spy, call, encoding.ids
        with spy.lock:
            spy.held[call] += 1

    def __del__(self) -> None:
        with self.spy.lock:
            self.spy.held[self.call] -= 1


@pytest.mark.parametrize("form", ["list", "large_string"])
def test_each_call_gets_one_sub_batch_and_the_previous_encodings_are_gone(bpe_json, texts, monkeypatch, form):
    limit = 2000
    monkeypatch.setattr(hf_family, "SUB_BATCH_BYTES", limit)
    tok = load_tokenizer(str(bpe_json), backend="hf")
    spy = _Spy(tok._source.ref)
    tokens, offsets = hf_family._reference_arrays(spy, _forms(texts)[form])
    assert _split(tokens, offsets) == _reference(tok, texts)
    assert [t for call in spy.calls for t in call] == texts  # every document once, in order
    assert len(spy.calls) > 10
    for call in spy.calls:
        size = sum(len(t.encode()) for t in call) if form == "large_string" else sum(map(len, call))
        assert size <= limit or len(call) == 1, f"a call of {len(call)} documents and {size} bytes"
    # While a call runs, the ids of at most two earlier ones are being copied out or wait to be: the
    # Encodings of three sub-batches at most, whatever the batch's size.
    assert max(map(len, spy.alive_at_call)) <= 2, spy.alive_at_call
    assert any(spy.alive_at_call), "the library's calls never overlapped the copying out of ids"
    assert spy.alive == 0
    spy.calls.clear()
    spy.alive_at_call.clear()
    assert hf_family._reference_lists(spy, texts) == _reference(tok, texts)
    assert len(spy.calls) > 10 and spy.alive_at_call == [set()] * len(spy.calls)


# Peak RSS of one encode_batch, in a fresh process: /proc/self/clear_refs "5" resets VmHWM (Linux >= 4.0).
_PEAK = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
import pyarrow as pa
from support import tokenizer_files
from shardflow.tokenizers import hf_family, load_tokenizer
hf_family.SUB_BATCH_BYTES = int(sys.argv[2])
texts = pa.array(tokenizer_files.corpus_documents() * 3, pa.large_string())
tok = load_tokenizer(sys.argv[1], backend="hf")
tok.encode_batch(["warm up"])
def kb(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kb("VmRSS:")
tokens, offsets = tok.encode_batch(texts)
print(json.dumps({"text_bytes": texts.nbytes, "tokens": len(tokens), "peak_delta": (kb("VmHWM:") - before) * 1024}))
"""


@pytest.mark.slow
def test_peak_memory_is_a_fraction_of_one_call_per_batch(llama3_dir):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    tests_dir = str(Path(__file__).resolve().parent)

    def peak(sub_batch_bytes: int) -> dict[str, int]:
        out = subprocess.run([sys.executable, "-c", _PEAK, str(llama3_dir), str(sub_batch_bytes), tests_dir],
                             capture_output=True, text=True, check=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])

    one_call = peak(1 << 40)
    sub = peak(256 << 10)
    assert sub["tokens"] == one_call["tokens"] > 2_000_000
    # One call held ~70 bytes a token of Encoding objects; sub-batches hold a 256 KiB call's worth.
    assert sub["peak_delta"] <= one_call["peak_delta"] / 3, (sub, one_call)
    # Lists of ids kept for the whole batch (29 bytes a token) would be about 7x the text here.
    assert sub["peak_delta"] <= 6 * sub["text_bytes"], (sub, one_call)
