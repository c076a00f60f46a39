"""PCA dimension reduction of embeddings, fitted with numpy's SVD: pure functions, no I/O.

    ids = sample_ids(n, 10_000)                 # evenly spaced rows to fit on
    p = fit_pca(vectors[ids], k=128)            # mean (D,), components (K, D), float32
    reduced = p.project(vectors)                # (n, K): (x - mean) @ components.T
    approx = p.reconstruct(reduced)             # (n, D): reduced @ components + mean

The fit centers the sample in float64 and takes the top ``k`` right singular
vectors. It is deterministic: the sample is a fixed stride over the rows, and
each component's sign is fixed so that its entry of largest magnitude is
positive (an SVD returns each singular vector only up to sign, and which sign
can change with the LAPACK build or thread count). The mean and components are
stored as float32 and every projection uses exactly those float32 arrays, so a
query projected at training time lands in the same space as the stored rows.

``project`` and ``reconstruct`` work in row blocks, so their temporaries stay
bounded whatever the number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ConfigError

__all__ = ["Projection", "as_rows", "check_reduction", "fit_pca", "sample_ids"]

F32 = NDArray[np.float32]

_BLOCK_ROWS = 16384  # rows per block of project/reconstruct (25 MB of float32 at dim 384)


def sample_ids(n: int, m: int) -> NDArray[np.int64]:
    """``m`` row ids spread evenly over ``[0, n)``, ascending, the first one 0.

    A fixed stride rather than a random draw: the same rows on every run and
    platform, and every part of the corpus (which is often grouped by source)
    is represented.
    """
    if not 0 <= m <= n:
        raise ValueError(f"cannot sample {m} of {n} rows")
    return (np.arange(m, dtype=np.int64) * n) // max(m, 1)


def check_reduction(
    k: int, *, input_dim: int, sample_rows: int, where: str = "the PCA", more_rows: str = "fit on more rows"
) -> None:
    """Refuse (``ConfigError``, a ValueError) a target dimension ``k`` the sample cannot support.

    ``k`` must be at most the input dimension, and at most ``sample_rows - 1``:
    centering spends one degree of freedom, so ``m`` centered rows span at most
    ``m - 1`` directions and further components would be arbitrary.
    ``where`` starts the message; ``more_rows`` says how to get a bigger sample.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"{where}: the reduced dimension must be a positive integer, not {k!r}")
    if k > input_dim:
        raise ConfigError(
            f"{where}: cannot reduce {input_dim}-dimensional embeddings to {k} dimensions; "
            f"choose a dimension of at most {input_dim}"
        )
    if k > sample_rows - 1:
        raise ConfigError(
            f"{where}: a {k}-dimensional PCA needs a sample of at least {k + 1} rows (centering uses one), "
            f"but the sample has {sample_rows}; choose a dimension of at most {max(sample_rows - 1, 0)} "
            f"or {more_rows}"
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Projection:
    """A fitted PCA: ``mean`` float32 ``(D,)`` and orthonormal ``components`` float32 ``(K, D)``."""

    mean: F32
    components: F32
    explained_variance_ratio: float | None = None
    """Variance of the fit sample kept by the ``K`` components (None when loaded without it)."""

    def __post_init__(self) -> None:
        mean, comps = self.mean, self.components
        if not (isinstance(mean, np.ndarray) and isinstance(comps, np.ndarray)):
            raise ValueError("mean and components must be numpy arrays")
        if mean.dtype != np.float32 or comps.dtype != np.float32:
            raise ValueError(f"mean and components must be float32, got {mean.dtype} and {comps.dtype}")
        if mean.ndim != 1 or comps.ndim != 2 or comps.shape[1] != mean.shape[0] or not 1 <= comps.shape[0] <= comps.shape[1]:
            raise ValueError(f"mean must be (D,) and components (K, D) with 1 <= K <= D, got {mean.shape} and {comps.shape}")
        if not (np.isfinite(mean).all() and np.isfinite(comps).all()):
            raise ValueError("mean and components must be finite")

    @property
    def input_dim(self) -> int:
        """``D``: the dimension of the model's embeddings."""
        return int(self.components.shape[1])

    @property
    def dim(self) -> int:
        """``K``: the dimension of the projected rows."""
        return int(self.components.shape[0])

    def project(self, x: Any) -> F32:
        """``(x - mean) @ components.T`` as float32: ``(n, D) -> (n, K)``, or ``(D,) -> (K,)``."""
        a = as_rows(x, self.input_dim, "embeddings to project")
        out = np.empty((a.shape[0], self.dim), dtype=np.float32)
        ct = self.components.T
        for lo in range(0, a.shape[0], _BLOCK_ROWS):
            hi = min(lo + _BLOCK_ROWS, a.shape[0])
            np.matmul(a[lo:hi] - self.mean, ct, out=out[lo:hi])
        return out[0] if np.ndim(x) == 1 else out

    def reconstruct(self, y: Any) -> F32:
        """Back to the model's space, ``y @ components + mean``: ``(n, K) -> (n, D)``, or ``(K,) -> (D,)``."""
        a = as_rows(y, self.dim, "projected rows to reconstruct")
        out = np.empty((a.shape[0], self.input_dim), dtype=np.float32)
        for lo in range(0, a.shape[0], _BLOCK_ROWS):
            hi = min(lo + _BLOCK_ROWS, a.shape[0])
            np.matmul(a[lo:hi], self.components, out=out[lo:hi])
            out[lo:hi] += self.mean
        return out[0] if np.ndim(y) == 1 else out


def as_rows(x: Any, dim: int, what: str) -> F32:
    """``x`` as a C-contiguous float32 ``(n, dim)`` array (a 1-D ``(dim,)`` is one row; not always a copy).

    A ValueError names ``what`` and the shapes when ``x`` is not numeric, has
    the wrong width, or holds NaN or infinity.
    """
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.ndim not in (1, 2) or a.shape[-1] != dim:
        raise ValueError(f"{what} must be a numeric array of shape (n, {dim}) or ({dim},), got {a.dtype} {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, dim)
    if not np.isfinite(a).all():
        raise ValueError(f"{what} contain NaN or infinity")
    return a


def fit_pca(sample: Any, k: int) -> Projection:
    """Fit a ``k``-component PCA on ``sample`` (float ``(m, D)``) with numpy's SVD of the centered rows.

    Memory: about three float64 copies of the sample (centered rows, U, and
    LAPACK's workspace). Refuses ``k`` above ``D`` or ``m - 1``
    (:func:`check_reduction`).
    """
    x = np.asarray(sample)
    if x.ndim != 2 or x.dtype.kind != "f":
        raise ValueError(f"sample must be a 2-D float array (rows, dim), got {x.dtype} {x.shape}")
    m, d = x.shape
    check_reduction(k, input_dim=d, sample_rows=m)
    centered = x.astype(np.float64)
    if not np.isfinite(centered).all():
        raise ValueError("sample contains NaN or infinity")
    mean = centered.mean(axis=0)
    centered -= mean
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    comps = vt[:k]
    # Sign fix: the largest-magnitude entry of each component is positive (the first such entry on a tie).
    pivot = np.abs(comps).argmax(axis=1)
    comps = comps * np.where(comps[np.arange(k), pivot] < 0, -1.0, 1.0)[:, None]
    energy = s * s
    total = float(energy.sum())
    ratio = float(energy[:k].sum() / total) if total > 0 else 1.0
    return Projection(
        mean=mean.astype(np.float32),
        components=np.ascontiguousarray(comps, dtype=np.float32),
        explained_variance_ratio=ratio,
    )
