"""``shardflow._arrow``: the same Arrow arrays as pyarrow's conversions of Python objects, without importing pandas."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow._arrow import bool_array, byte_lengths, large_binaries, large_strings

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | _text, max_size=30))
def test_large_strings_equal_pyarrows_conversion(values):
    built = large_strings(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.large_string())) and built.null_count == values.count(None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=20), max_size=30))
def test_large_binaries_equal_pyarrows_conversion(values):
    built = large_binaries(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.large_binary()))


def test_a_lone_surrogate_raises_as_pyarrow_does():
    with pytest.raises(UnicodeEncodeError):
        pa.array(["ok", "\udcff"], type=pa.large_string())
    with pytest.raises(UnicodeEncodeError):
        large_strings(["ok", "\udcff"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=70), st.integers(0, 9), st.integers(0, 9))
def test_bool_array_reads_the_bitmap_from_the_arrays_offset(bits, cut_front, cut_back):
    mask = pa.array(bits, type=pa.bool_())
    part = mask.slice(min(cut_front, len(bits)), max(0, len(bits) - cut_front - cut_back))
    assert bool_array(part).tolist() == part.to_pylist() and bool_array(part).dtype == np.bool_


def test_bool_array_refuses_nulls():
    with pytest.raises(ValueError, match="the mask has nulls"):
        bool_array(pa.array([True, None]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | _text, max_size=30), st.sampled_from([pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]),
       st.integers(min_value=0, max_value=5), st.integers(min_value=1, max_value=4))
def test_byte_lengths_are_binary_length_for_any_string_array_sliced_or_chunked(values, type_, cut, chunks):
    import pyarrow.compute as pc

    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        values = [None if v is None else v.encode("utf-8") for v in values]
    array = pa.array(values, type=type_)
    sliced = array.slice(min(cut, len(array)))
    want = [n or 0 for n in pc.binary_length(sliced).to_pylist()]
    assert byte_lengths(sliced).tolist() == want and byte_lengths(sliced).dtype == np.int64
    step = max(1, len(sliced) // chunks)
    chunked = pa.chunked_array([sliced[i : i + step] for i in range(0, len(sliced), step)], type=type_)
    assert byte_lengths(chunked).tolist() == want


@pytest.mark.slow
def test_tokenizing_a_parquet_or_jsonl_input_imports_no_pandas(tmp_path):
    """pandas (0.5 s of import on the GIL) is not imported by reading, cleaning and tokenizing texts."""
    from support.paths import SAMPLE

    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "one"}\n{"text": null}\n{"text": ""}\n{"text": "two \\udcff"}\n')
    code = (
        "import sys\nfrom shardflow.cli.commands import main\n"
        f"for src, name in (({str(SAMPLE)!r}, 'p'), ({str(jsonl)!r}, 'j')):\n"
        "    assert main(['build', src, '--name', name, '--data-root', 'd', '--catalog', 'c', '--no-prefect', '--progress', 'none', '--no-card']) == 0\n"
        "print('pandas' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "HOME", "SHARDFLOW_CACHE")})
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
