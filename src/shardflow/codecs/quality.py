"""What a codec costs in retrieval terms: :func:`quality`.

Cosine between each float32 original row and its decoded row (mean and min),
and nearest-neighbour recall@k of the decoded rows (or of another space given
as ``search``) against the originals, on a deterministic sample.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import F32, check_matrix


def quality(
    reference: F32,
    decoded: F32,
    k: int = 10,
    *,
    sample: int = 2000,
    seed: int = 0,
    search: F32 | None = None,
) -> dict[str, float | int]:
    """Compare decoded embeddings with their float32 originals.

    On a deterministic sample (all rows if ``n <= sample``, else ``sample``
    rows drawn with ``seed``) returns ``mean_cosine`` / ``min_cosine`` between
    each reference row and its decoded row, and ``recall_at_k``: for each
    sampled row, the fraction of its ``k`` nearest neighbours by cosine within
    the sample (itself excluded) under ``reference`` that are also among its
    ``k`` nearest under ``decoded``, averaged.  Also returns ``rows`` and ``k``.

    ``search``, when given, is where the neighbours are looked up instead of
    ``decoded``: the same rows in another space of any width (the embedding
    stage passes the PCA-reduced rows while ``decoded`` holds their
    reconstruction in the model's space).
    """
    arrays = [("reference", reference), ("decoded", decoded)] + ([] if search is None else [("search", search)])
    for name, a in arrays:
        check_matrix(a, name)
        if a.dtype != np.float32:
            raise ValueError(f"{name} must be float32, got {a.dtype}")
    if reference.shape != decoded.shape:
        raise ValueError(f"shape mismatch: reference {reference.shape} vs decoded {decoded.shape}")
    if search is not None and search.shape[0] != reference.shape[0]:
        raise ValueError(f"search has {search.shape[0]} rows, reference {reference.shape[0]}; they must be the same rows")
    n = reference.shape[0]
    if sample < 2:
        raise ValueError(f"sample must be >= 2, got {sample}")
    m = min(n, sample)
    if not 1 <= k < m:
        raise ValueError(f"k must be in [1, {m - 1}] for {m} sampled rows, got {k}")
    if n > sample:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=sample, replace=False))
        ref, dec = reference[rows], decoded[rows]
        found = None if search is None else search[rows]
    else:
        ref, dec, found = reference, decoded, search
    # float64 so the quality figures themselves carry no rounding noise.
    ref = ref.astype(np.float64)
    dec = dec.astype(np.float64)
    rn = np.linalg.norm(ref, axis=1)
    dn = np.linalg.norm(dec, axis=1)
    both_zero = (rn == 0) & (dn == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("ij,ij->i", ref, dec) / (rn * dn)
    # A zero row decoded as zero is perfect; zero vs non-zero is orthogonal.
    cos = np.where(both_zero, 1.0, np.nan_to_num(cos, nan=0.0))

    def topk(a: NDArray[np.float64], norms: NDArray[np.float64]) -> NDArray[np.intp]:
        u = a / np.where(norms == 0, 1.0, norms)[:, None]
        sim = u @ u.T
        np.fill_diagonal(sim, -np.inf)  # exclude self
        return np.argpartition(-sim, k - 1, axis=1)[:, :k]

    if found is None:
        ta, tb = topk(ref, rn), topk(dec, dn)
    else:
        f = found.astype(np.float64)
        ta, tb = topk(ref, rn), topk(f, np.linalg.norm(f, axis=1))
    hits = sum(len(np.intersect1d(ta[i], tb[i], assume_unique=True)) for i in range(m))
    return {
        "rows": int(m),
        "k": int(k),
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "recall_at_k": hits / (m * k),
    }
