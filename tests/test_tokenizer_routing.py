"""``routing.Substrings``: which documents hold a text the fast backend treats differently (a control piece).

The answer must be exactly Python's ``text in document`` for every document,
whatever characters the texts hold (regular-expression punctuation included),
since a missed document would be encoded by gigatoken and get a special id.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.tokenizers.probing import Probed
from shardflow.tokenizers.routing import Routes, Substrings

# Control pieces of real models, and texts made of every kind of character a pattern could misread.
TEXTS = ["<s>", "</s>", "<|endoftext|>", "[INST]", "<0x0A>", "a.b", "\\", "^$", "(?i)", "x y", "\n", "é▁", "{1,3}", "|"]


def _expected(substrings: Substrings, docs: list[str]) -> list[int]:
    return [i for i, doc in enumerate(docs) if any(t in doc for t in substrings.texts)]


def test_hits_are_the_documents_holding_a_text():
    docs = ["plain", "a <s> b", "</s>", "<s", "A.B", "aXb", "a.b", "back\\slash", "x  y", "x y", "", "\n", "é▁", "\U0001f642 ^$"]
    s = Substrings(TEXTS)
    got = s.hits(pa.array(docs, type=pa.large_string())).tolist()
    assert got == _expected(s, docs) == [1, 2, 6, 7, 9, 11, 12, 13]
    # A chunked array (what a batch of several row groups is) gives the same answer.
    assert s.hits(pa.chunked_array([pa.array(docs[:5]), pa.array(docs[5:])])).tolist() == got


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.sampled_from(TEXTS), min_size=1, max_size=4),
    docs=st.lists(st.lists(st.sampled_from([*TEXTS, "a", " ", ".", "<", ">", "s", "/"]), max_size=8).map("".join), max_size=8),
)
def test_hits_agree_with_in_on_any_documents(texts, docs):
    s = Substrings(texts)
    assert s.hits(pa.array(docs, type=pa.large_string())).tolist() == _expected(s, docs)


def test_no_texts_and_no_documents_hit_nothing():
    assert Substrings(["", ""]).hits(pa.array(["<s>", ""], type=pa.large_string())).tolist() == []
    assert Substrings(["<s>"]).hits(pa.array([], type=pa.large_string())).tolist() == []


class _Fast:
    """gigatoken's stand-in: every character is its code point, but U+323B0 (a Unicode 17 letter) is 0."""

    def encode_batch_list(self, texts):
        return [[0 if c == "\U000323b0" else ord(c) for c in t] for t in texts]


def test_routes_hit_a_document_either_rule_hits_once():
    probed = Probed(_Fast(), lambda texts: [[ord(c) for c in t] for t in texts], key=None, name="t", library="ref")
    routes = Routes([probed, Substrings(["<s>"])])
    docs = pa.array(["plain", "\U000323b0's", "<s> and \U000323b0", "<s>"], type=pa.large_string())
    assert routes.hits(docs).tolist() == [1, 2, 3]
    assert routes.hits(docs).dtype == np.int64
    assert probed.code_points == (0x323B0,)
