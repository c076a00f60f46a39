"""Tests for shardflow.codecs: exactness, error bounds, validation, fetch, quality."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardflow.codecs import CODECS, Codec, codec_names, get_codec, quality
from shardflow.config import EMBED_CODECS
from shardflow.errors import ConfigError

FP8 = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
# (relative error bound for normals, absolute bound in the subnormal range)
FP8_BOUNDS = {"e4m3": (2.0**-4, 2.0**-10), "e5m2": (2.0**-3, 2.0**-17)}
ALL = sorted(CODECS)


def ml_dtypes_reference(x: np.ndarray, fmt: str) -> np.ndarray:
    """What the codec must reproduce bit for bit: clip, then ml_dtypes' RNE cast."""
    dt, mx = FP8[fmt]
    return np.clip(x, -mx, mx).astype(dt).view(np.uint8)


def embeddings(n: int = 300, d: int = 384, seed: int = 0) -> np.ndarray:
    """Unit-norm rows with a realistic spread of magnitudes (like MiniLM's)."""
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def tricky_bit_patterns() -> np.ndarray:
    """Every 14-bit table key with low bits 0, 1, just-below/at/above a tie.

    The encoder looks float32 patterns up by their top 14 bits plus a sticky
    bit, so covering each key with each kind of low part covers every case the
    table distinguishes (ties, just-off-ties, subnormals, +-0, overflow).
    """
    keys = np.arange(1 << 14, dtype=np.uint32) << np.uint32(18)
    lows = np.array([0, 1, 0x1FFFF, 0x20000, 0x20001, 0x3FFFF, 0x3FFFE, 0x12345], dtype=np.uint32)
    u = (keys[:, None] | lows[None, :]).reshape(-1)
    # also the whole-bit-19 neighbourhood: e4m3's round bit is bit 19
    u = np.concatenate([u, (keys[:, None] | np.uint32(0x80000) | lows[None, :]).reshape(-1)])
    f = u.view(np.float32)
    f = f[np.isfinite(f)]
    return f.reshape(-1, 2)  # the codecs take 2-D input


# ---------------------------------------------------------------- registry


def test_registry_names_and_types() -> None:
    assert codec_names() == ALL
    assert set(ALL) == {"float32", "float16", "e4m3", "e5m2", "e4m3-rowscale", "e5m2-rowscale", "int8"}
    for name, codec in CODECS.items():
        assert isinstance(codec, Codec)
        assert codec.name == name
        assert get_codec(name) is codec
    assert get_codec("int8").storage_dtype == np.int8
    assert get_codec("e4m3").storage_dtype == np.uint8
    assert get_codec("float16").storage_dtype == np.float16
    assert [n for n in ALL if CODECS[n].has_scales] == ["e4m3-rowscale", "e5m2-rowscale", "int8"]


def test_codecs_are_frozen_and_registry_read_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_codec("int8").name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CODECS["mine"] = get_codec("int8")  # type: ignore[index]


def test_unknown_codec_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown codec 'fp4'.*known codecs: e4m3, e4m3-rowscale, .*int8"):
        get_codec("fp4")
    with pytest.raises(ConfigError):  # the CLI reports these without a traceback
        get_codec("E4M3")


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_encode_bit_identical_to_ml_dtypes_on_every_table_key(fmt: str) -> None:
    x = tricky_bit_patterns()
    codes, scales = get_codec(fmt).encode(x)
    assert scales is None
    assert codes.dtype == np.uint8
    np.testing.assert_array_equal(codes, ml_dtypes_reference(x, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_special_values(fmt: str) -> None:
    dt, mx = FP8[fmt]
    fi = ml_dtypes.finfo(dt)
    tiny = float(fi.smallest_subnormal)
    vals = [
        0.0, -0.0, tiny, -tiny, tiny / 2, tiny / 2 * (1 + 2**-20), tiny * 1.5, tiny * 2.5,  # ties at the bottom
        float(fi.smallest_normal), float(fi.smallest_normal) * (1 - 2**-20),
        1.0, 1.0 + 2**-4, 1.0 + 2**-4 + 2**-12, 1.0 + 3 * 2**-4, 1.0 + 2**-3, 1.0 + 2**-2 + 2**-3,  # ties
        mx, mx * 1.03, mx * 1.04, mx * 1.1, 1e30, 3.4e38,  # overflow is clipped
        1e-45, 1e-40, 1.17549435e-38,  # float32 subnormal/normal boundary
    ]
    x = np.array(vals + [-v for v in vals], dtype=np.float32).reshape(-1, 1)
    codes, _ = get_codec(fmt).encode(x)
    np.testing.assert_array_equal(codes, ml_dtypes_reference(x, fmt))
    dec = get_codec(fmt).decode(codes)
    assert np.isfinite(dec).all()
    assert np.abs(dec).max() == mx
    # -0.0 keeps its sign bit (0x80)
    assert codes[1, 0] == 0x80 and codes[0, 0] == 0x00


def test_float16_double_rounding_counterexample_is_handled() -> None:
    # float32 -> float16 makes this a tie (1 + 2**-4), which e4m3 would round
    # down to 1.0; the correct e4m3 value is 1.125.
    x = np.array([[1.0 + 2**-4 + 2**-12]], dtype=np.float32)
    assert x.astype(np.float16).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)[0, 0] == 1.0
    codes, _ = get_codec("e4m3").encode(x)
    assert get_codec("e4m3").decode(codes)[0, 0] == 1.125


finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
small_shapes = hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, small_shapes, elements=finite_f32))
def test_fp8_bit_identical_property(x: np.ndarray) -> None:
    for fmt in FP8:
        codes, _ = get_codec(fmt).encode(x)
        np.testing.assert_array_equal(codes, ml_dtypes_reference(x, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_decode_matches_ml_dtypes_for_all_codes(fmt: str) -> None:
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    expected = codes.view(FP8[fmt][0]).astype(np.float32)
    np.testing.assert_array_equal(get_codec(fmt).decode(codes), expected)


def test_float16_matches_numpy_cast_and_saturates() -> None:
    x = np.concatenate([embeddings(50, 64), np.array([[7e4, -1e9] + [0.0] * 62], dtype=np.float32)])
    codes, scales = get_codec("float16").encode(x)
    assert scales is None and codes.dtype == np.float16
    np.testing.assert_array_equal(codes, np.clip(x, -65504, 65504).astype(np.float16))
    dec = get_codec("float16").decode(codes)
    np.testing.assert_array_equal(dec, codes.astype(np.float32))
    assert dec[-1, 0] == 65504 and dec[-1, 1] == -65504


def test_float32_is_exact_copy() -> None:
    x = embeddings(20, 16)
    codes, scales = get_codec("float32").encode(x)
    assert scales is None and codes is not x
    np.testing.assert_array_equal(codes, x)
    np.testing.assert_array_equal(get_codec("float32").decode(codes), x)


# ---------------------------------------------------------------- error bounds


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_round_trip_error_bound(fmt: str) -> None:
    x = embeddings() * 3.0
    codec = get_codec(fmt)
    dec = codec.decode(*codec.encode(x))
    rel, absb = FP8_BOUNDS[fmt]
    assert np.all(np.abs(dec - x) <= rel * np.abs(x) + absb)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_rowscale_round_trip_error_bound_any_magnitude(fmt: str) -> None:
    rng = np.random.default_rng(1)
    x = embeddings(64, 96) * (10.0 ** rng.uniform(-30, 30, size=(64, 1))).astype(np.float32)
    codec = get_codec(f"{fmt}-rowscale")
    codes, scales = codec.encode(x)
    assert scales is not None and scales.dtype == np.float32 and scales.shape == (64,)
    assert np.all(np.isfinite(scales)) and np.all(scales > 0)
    dec = codec.decode(codes, scales)
    rel, absb = FP8_BOUNDS[fmt]
    bound = rel * np.abs(x) * 1.0001 + absb * scales[:, None]
    assert np.all(np.abs(dec - x) <= bound)
    # the row maximum is representable exactly, so it survives (up to float32 rounding)
    np.testing.assert_allclose(np.abs(dec).max(axis=1), np.abs(x).max(axis=1), rtol=1e-6)


def test_int8_round_trip_error_bound_and_code_range() -> None:
    x = embeddings() * np.linspace(0.01, 100, 300, dtype=np.float32)[:, None]
    codec = get_codec("int8")
    codes, scales = codec.encode(x)
    assert codes.dtype == np.int8 and scales is not None and scales.shape == (300,)
    assert codes.min() >= -127 and codes.max() <= 127
    assert np.all(np.abs(codes).max(axis=1) == 127)  # absmax maps to +-127
    np.testing.assert_allclose(scales, np.abs(x).max(axis=1) / 127, rtol=1e-6)
    dec = codec.decode(codes, scales)
    assert np.all(np.abs(dec - x) <= scales[:, None] * 0.5001)


def int8_bound(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    # half a step, plus float32 rounding of the products
    return scales[:, None] * 0.5001 + np.abs(x) * 1e-6 + 1e-44


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, small_shapes, elements=finite_f32))
def test_scaled_codecs_property(x: np.ndarray) -> None:
    codec = get_codec("int8")
    codes, scales = codec.encode(x)
    assert scales is not None
    assert np.all(np.isfinite(scales)) and np.all(scales > 0)
    assert codes.min() >= -127 and codes.max() <= 127
    dec = codec.decode(codes, scales)
    assert np.isfinite(dec).all()
    assert np.all(np.abs(dec.astype(np.float64) - x) <= int8_bound(x, scales))
    for fmt in FP8:
        codec = get_codec(f"{fmt}-rowscale")
        codes, scales = codec.encode(x)
        assert scales is not None
        assert np.all(np.isfinite(scales)) and np.all(scales > 0)
        dec = codec.decode(codes, scales)
        assert np.isfinite(dec).all()
        rel, absb = FP8_BOUNDS[fmt]
        bound = rel * np.abs(x.astype(np.float64)) * 1.0001 + absb * scales[:, None] * 1.0001 + 1e-44
        assert np.all(np.abs(dec.astype(np.float64) - x) <= bound)


# ---------------------------------------------------------------- edge rows


@pytest.mark.parametrize("name", ["int8", "e4m3-rowscale", "e5m2-rowscale"])
def test_zero_and_tiny_rows_get_positive_finite_scales(name: str) -> None:
    x = np.zeros((4, 8), dtype=np.float32)
    x[1] = 1e-45  # smallest float32 subnormal
    x[2, 3] = -1e-39
    x[3] = 1.0
    codec = get_codec(name)
    codes, scales = codec.encode(x)
    assert scales is not None
    assert scales[0] == 1.0 and np.all(codes[0] == 0)
    assert np.all(np.isfinite(scales)) and np.all(scales > 0)
    dec = codec.decode(codes, scales)
    assert np.all(dec[0] == 0)
    np.testing.assert_allclose(dec[3], 1.0, rtol=2**-4)
    np.testing.assert_allclose(dec[:3], x[:3], atol=1e-38)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_overflow_is_clipped_not_nan(fmt: str) -> None:
    mx = FP8[fmt][1]
    x = np.array([[500.0, -465.0, 1e6, -3e38, 6e4, 1e5]], dtype=np.float32)
    dec = get_codec(fmt).decode(get_codec(fmt).encode(x)[0])
    assert not np.isnan(dec).any()
    expected = np.clip(x, -mx, mx).astype(FP8[fmt][0]).astype(np.float32)
    np.testing.assert_array_equal(dec, expected)
    # the raw ml_dtypes cast would have produced NaN for e4m3 (the reason we clip)
    if fmt == "e4m3":
        assert np.isnan(x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)).any()


# ---------------------------------------------------------------- golden output

# SHA-256 of codes.tobytes() + scales.tobytes() (codes alone when a codec has
# no scales) for golden_matrix(), computed with the single-module
# shardflow/codecs.py before it became a package.  Published datasets hold
# these bytes, so no refactoring may change them.
GOLDEN_SHA256 = {
    "float32": "7a592a9c811d381c7d505d93734ab4b26b813f3af426b31d3626d28704b1c296",
    "float16": "e21ac6d20295c968210d3e7f948c20e87c421b528a3fb4abf598d3e8d538c078",
    "e4m3": "5985afa312c257ecdbb07c25b6aa3aa1ecf695f78c7cebd3707c0752dc822803",
    "e5m2": "e07043243db4090e15cf6d35a27e510ab6f9c225c5bc3f0ba61426be46cc2264",
    "e4m3-rowscale": "961834b2e6d5c92781977a308359547be5fee3da151791067116ee271a092a8e",
    "e5m2-rowscale": "8554f3cd17344eb2dd769271c193b3e0b473d87c064380ef2f9ae5dbda15de8a",
    "int8": "a6550abca8d48113793ab597fca7156debbe18e0c86836303826fca5c5275ea8",
}


def golden_matrix() -> np.ndarray:
    """(3000, 96) seeded normals, rows scaled by 2^U(-40, 40) (so fp8 and float16 saturate
    and underflow), plus a +0 row, a -0 row, rows above and below the absmax caps of the
    scaled codecs and a float32 subnormal; 3000 rows are two chunks."""
    rng = np.random.default_rng(20240611)
    x = rng.standard_normal((3000, 96)).astype(np.float32)
    x *= np.exp2(rng.uniform(-40.0, 40.0, size=(3000, 1))).astype(np.float32)
    x[5] = 0.0
    x[6] = -0.0
    x[7, ::3] = 3.4028e38  # above _MAX_ABSMAX
    x[8] = -1e-36  # below _MIN_ABSMAX
    x[9, 1] = 1e-45
    return x


def test_encoded_bytes_match_the_golden_hashes() -> None:
    assert list(GOLDEN_SHA256) == list(CODECS)  # every codec, in registry order
    x = golden_matrix()
    for name, codec in CODECS.items():
        codes, scales = codec.encode(x)
        assert codes.shape == x.shape and codes.dtype == codec.storage_dtype
        digest = hashlib.sha256(codes.tobytes())
        if scales is not None:
            digest.update(scales.tobytes())
        assert digest.hexdigest() == GOLDEN_SHA256[name], name


def test_config_codec_names_match_the_registry() -> None:
    # shardflow.config keeps its own tuple (it must not import ml_dtypes); it must list the same codecs.
    assert EMBED_CODECS == tuple(CODECS)


def test_package_exports_its_public_names() -> None:
    import shardflow.codecs as m

    assert m.__all__ == ["CODECS", "Codec", "Fp8Codec", "FloatCodec", "Int8Codec", "codec_names", "get_codec", "quality"]
    assert callable(m.quality)  # the function, not the submodule of the same name


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_rejected(name: str, bad: float) -> None:
    x = embeddings(10, 8)
    x[7, 3] = bad
    with pytest.raises(ValueError, match="NaN or infinity"):
        get_codec(name).encode(x)


@pytest.mark.parametrize("name", ALL)
def test_empty_and_single_column(name: str) -> None:
    codec = get_codec(name)
    codes, scales = codec.encode(np.zeros((0, 5), dtype=np.float32))
    assert codes.shape == (0, 5)
    assert codec.decode(codes, scales).shape == (0, 5)
    x = np.array([[0.5], [-2.0]], dtype=np.float32)
    codes, scales = codec.encode(x)
    np.testing.assert_allclose(codec.decode(codes, scales), x, rtol=0.13)


# ---------------------------------------------------------------- chunking / threads / memory layout


@pytest.mark.parametrize("name", ALL)
def test_multi_chunk_and_threaded_results_identical(name: str) -> None:
    # 3000 x 384 = 1.15M elements: several chunks, and the threaded path.
    x = embeddings(3000, 384, seed=3)
    x[::7] *= 50.0
    codec = get_codec(name)
    c1, s1 = codec.encode(x, threads=1)
    c2, s2 = codec.encode(x, threads=2)
    np.testing.assert_array_equal(c1, c2)
    if s1 is not None:
        np.testing.assert_array_equal(s1, s2)
    if name in FP8:
        np.testing.assert_array_equal(c1, ml_dtypes_reference(x, name))
    d1 = codec.decode(c1, s1, threads=1)
    d2 = codec.decode(c1, s1, threads=3)
    np.testing.assert_array_equal(d1, d2)


def test_odd_widths_and_non_contiguous_input() -> None:
    x = embeddings(700, 1001, seed=4)  # rows per chunk does not divide n
    xt = np.asfortranarray(x)
    for fmt in FP8:
        np.testing.assert_array_equal(get_codec(fmt).encode(xt)[0], ml_dtypes_reference(x, fmt))
    c, s = get_codec("int8").encode(x[:, ::2])
    np.testing.assert_array_equal(c, get_codec("int8").encode(np.ascontiguousarray(x[:, ::2]))[0])


@pytest.mark.parametrize("name", ALL)
def test_decode_into_out(name: str) -> None:
    codec = get_codec(name)
    x = embeddings(40, 24)
    codes, scales = codec.encode(x)
    out = np.full_like(x, np.nan)
    res = codec.decode(codes, scales, out=out)
    assert res is out
    np.testing.assert_array_equal(out, codec.decode(codes, scales))


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (np.zeros(8, dtype=np.float32), "must be 2-D"),
        (np.zeros((2, 3, 4), dtype=np.float32), "must be 2-D"),
        (np.zeros((3, 0), dtype=np.float32), "at least one column"),
        (np.zeros((3, 4), dtype=np.float64), "must be float32"),
        (np.zeros((3, 4), dtype=np.float16), "must be float32"),
        ([[1.0, 2.0]], "must be a numpy array"),
    ],
)
def test_encode_rejects_bad_input(name: str, bad: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_codec(name).encode(bad)


def test_decode_rejects_bad_codes_and_scales() -> None:
    x = embeddings(5, 8)
    i8 = get_codec("int8")
    codes, scales = i8.encode(x)
    assert scales is not None
    with pytest.raises(ValueError, match="decodes int8 codes, got uint8"):
        i8.decode(codes.view(np.uint8), scales)
    with pytest.raises(ValueError, match="needs a float32 scales array"):
        i8.decode(codes, None)
    with pytest.raises(ValueError, match=r"scales of shape \(5,\)"):
        i8.decode(codes, scales[:4])
    with pytest.raises(ValueError, match=r"scales of shape \(5,\)"):
        i8.decode(codes, scales.astype(np.float64))  # type: ignore[arg-type]
    bad = scales.copy()
    bad[2] = 0.0
    with pytest.raises(ValueError, match="positive and finite"):
        i8.decode(codes, bad)
    with pytest.raises(ValueError, match="must be 2-D"):
        i8.decode(codes.reshape(-1), scales)
    e4 = get_codec("e4m3")
    fp8codes, _ = e4.encode(x)
    with pytest.raises(ValueError, match="has no scales"):
        e4.decode(fp8codes, scales)
    with pytest.raises(ValueError, match="stored as uint8 bit patterns"):
        e4.decode(fp8codes.view(ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="C-contiguous float32 array of shape"):
        e4.decode(fp8codes, out=np.empty((5, 8), dtype=np.float64))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threads must be >= 1"):
        e4.encode(embeddings(3000, 384), threads=0)


# ---------------------------------------------------------------- storage & fetch


@pytest.mark.parametrize("name", ALL)
def test_codes_survive_npy_round_trip(name: str, tmp_path: Path) -> None:
    codec = get_codec(name)
    x = embeddings(30, 16)
    codes, scales = codec.encode(x)
    np.save(tmp_path / "codes.npy", codes)
    loaded = np.load(tmp_path / "codes.npy")
    assert loaded.dtype == codec.storage_dtype
    np.testing.assert_array_equal(codec.decode(loaded, scales), codec.decode(codes, scales))


@pytest.mark.parametrize("name", ALL)
def test_decode_rows_from_memmap(name: str, tmp_path: Path) -> None:
    codec = get_codec(name)
    x = embeddings(500, 32, seed=5)
    codes, scales = codec.encode(x)
    np.save(tmp_path / "c.npy", codes)
    mm = np.load(tmp_path / "c.npy", mmap_mode="r")
    full = codec.decode(codes, scales)
    ids = np.random.default_rng(0).integers(0, 500, size=77)
    ids[5] = ids[6]  # repeats are fine
    got = codec.decode_rows(mm, scales, ids)
    np.testing.assert_array_equal(got, full[ids])
    assert codec.decode_rows(mm, scales, [499, 0]).shape == (2, 32)
    assert codec.decode_rows(mm, scales, np.array([], dtype=np.int64)).shape == (0, 32)
    with pytest.raises(ValueError, match=r"ids must be in \[0, 500\)"):
        codec.decode_rows(mm, scales, [500])
    with pytest.raises(ValueError, match="1-D integer array"):
        codec.decode_rows(mm, scales, np.array([0.5]))


# ---------------------------------------------------------------- quality


def test_quality_identical_and_degraded() -> None:
    x = embeddings(400, 64, seed=6)
    q = quality(x, x.copy(), k=10)
    assert q["rows"] == 400 and q["k"] == 10
    assert q["mean_cosine"] == pytest.approx(1.0) and q["min_cosine"] == pytest.approx(1.0)
    assert q["recall_at_k"] == 1.0
    noisy = x + np.random.default_rng(7).standard_normal(x.shape).astype(np.float32) * 0.05
    qn = quality(x, noisy, k=10)
    assert 0.8 < qn["mean_cosine"] < 0.999
    assert qn["min_cosine"] <= qn["mean_cosine"]
    assert 0.0 < qn["recall_at_k"] < 1.0


def test_quality_ordering_of_codecs_and_sampling() -> None:
    x = embeddings(2500, 64, seed=8)
    results = {}
    for name in ("float16", "int8", "e4m3", "e5m2"):
        codec = get_codec(name)
        results[name] = quality(x, codec.decode(*codec.encode(x)), k=10, sample=600)
    assert results["float16"]["mean_cosine"] > results["int8"]["mean_cosine"] > results["e4m3"]["mean_cosine"]
    assert results["e4m3"]["mean_cosine"] > results["e5m2"]["mean_cosine"] > 0.99
    assert all(r["rows"] == 600 for r in results.values())
    # deterministic sample
    d = get_codec("e5m2").decode(get_codec("e5m2").encode(x)[0])
    assert quality(x, d, sample=600) == quality(x, d, sample=600)


def test_quality_zero_rows_and_validation() -> None:
    x = embeddings(20, 8)
    x[3] = 0.0
    assert quality(x, x.copy(), k=3)["min_cosine"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        quality(x, x[:10])
    with pytest.raises(ValueError, match=r"k must be in \[1, 19\]"):
        quality(x, x, k=20)
    with pytest.raises(ValueError, match="decoded must be float32"):
        quality(x, x.astype(np.float64))  # type: ignore[arg-type]


def test_quality_can_look_neighbours_up_in_another_space() -> None:
    x = embeddings(300, 32, seed=10)
    noisy = x + np.random.default_rng(11).standard_normal(x.shape).astype(np.float32) * 0.05
    plain = quality(x, noisy, k=10, sample=200)
    # neighbours searched in the decoded rows themselves: the same figures
    assert quality(x, noisy, k=10, sample=200, search=noisy) == plain
    # searched in a rotated copy of the originals (any width, same rows): perfect recall, cosines unchanged
    rotated = (x @ np.linalg.qr(np.random.default_rng(12).standard_normal((32, 48)).T)[0].T).astype(np.float32)
    q = quality(x, noisy, k=10, sample=200, search=rotated)
    assert q["recall_at_k"] == 1.0 and q["mean_cosine"] == plain["mean_cosine"]
    with pytest.raises(ValueError, match="search has 299 rows, reference 300; they must be the same rows"):
        quality(x, noisy, search=rotated[:299])


def test_threaded_codec_works_in_forked_child() -> None:
    """The persistent thread pool must not hang a child forked after first use."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    x = embeddings(3000, 384, seed=9)
    expected = get_codec("e4m3").encode(x)[0]  # starts the pool in the parent
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_encode_in_child, (x,)).get(timeout=60)
    np.testing.assert_array_equal(got, expected)


def _encode_in_child(x: np.ndarray) -> np.ndarray:
    return get_codec("e4m3").encode(x, threads=2)[0]
