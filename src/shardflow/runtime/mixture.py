"""Weighted mixtures of datasets: deterministic, exact per epoch, streamed like ``StreamingTokenDataset``.

    mix = MixtureDataset({"web@latest": 0.7, "code@v3": 0.3}, split="train", seq_len=1024, seed=0)

**Epoch.** A mixture epoch has ``M`` samples (``samples_per_epoch``; by default
the largest ``M`` for which no component repeats a sample, i.e. the component
that runs out first is read exactly once). Component ``d`` contributes exactly
``n_d`` samples, ``n_d`` being ``weight_d * M`` rounded by largest remainders
(so the counts add up to ``M`` and each is within one sample of its share).

**Interleaving.** Position ``x`` of an epoch maps to ``y = x * a mod M`` with
``a`` coprime to ``M`` near ``0.618 M``; ``y`` falls in the interval of
component ``d`` (the intervals have lengths ``n_d``) and is its ``y - start_d``-th
sample of the epoch. ``x -> y`` is a bijection, so the counts are exact, and
being a Kronecker sequence it spreads every component evenly: any run of
consecutive positions -- a rank's share, a batch, the first 10% of an epoch
-- holds each component close to its weight. No random numbers, no state.

**Components.** Each component is read as its own endless stream of epochs,
shuffled from ``(seed, component, epoch)`` like ``StreamingTokenDataset``:
mixture epoch ``e`` reads positions ``[e * n_d, (e + 1) * n_d)`` of it, so a
component smaller than its share wraps into its next epoch (upsampling) and a
larger one moves on through its data (no sample repeats before all were read).

Ranks, workers and ``state_dict`` work exactly as for ``StreamingTokenDataset``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..catalog import Catalog
from .dataset import Overflow, TokenDataset, _check_int
from .order import EpochOrder, coprime_stride
from .streaming import SampleStream

__all__ = ["MixtureDataset", "mixture_counts"]

def _check_weights(weights: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> list[tuple[Any, float]]:
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    if not items:
        raise ValueError("a mixture needs at least one dataset: pass {ref: weight, ...}")
    out: list[tuple[Any, float]] = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError(f"mixture entries are (dataset, weight) pairs, not {item!r}")
        key, w = item
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not math.isfinite(w):
            raise ValueError(f"the weight of {_name(key)} is {w!r}; weights must be finite positive numbers")
        out.append((key, float(w)))
    if all(w == 0 for _, w in out):
        raise ValueError("all mixture weights are 0; give every dataset a positive weight (e.g. {'a@latest': 0.7, 'b@latest': 0.3})")
    for key, w in out:
        if w < 0:
            raise ValueError(f"the weight of {_name(key)} is {w}; weights must be positive")
        if w == 0:
            raise ValueError(f"the weight of {_name(key)} is 0; remove that dataset from the mixture instead")
    return out


def _name(key: Any) -> str:
    if isinstance(key, TokenDataset):
        return repr(key.shards.name)
    return repr(os.fspath(key)) if isinstance(key, (str, os.PathLike)) else repr(key)


def mixture_counts(probs: np.ndarray, total: int) -> np.ndarray:
    """``probs * total`` rounded by largest remainders: non-negative ints that add up to ``total``."""
    raw = np.asarray(probs, dtype=np.float64) * total
    counts = np.floor(raw).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(raw - counts), kind="stable")[:short]] += 1
    return counts


def _mulmod(x: np.ndarray, a: int, m: int) -> np.ndarray:
    if m < 2**31:  # x * a < 2**62: exact in int64
        return (x * a) % m
    return np.array([(int(v) * a) % m for v in x.tolist()], dtype=np.int64)


class MixtureDataset(SampleStream):
    """Samples drawn from several datasets in fixed proportions, as an epoch stream.

    ``weights`` maps references (or ``TokenDataset`` objects) to positive
    weights (normalized to sum to 1). The other options are those of
    ``StreamingTokenDataset`` and apply to every component, plus
    ``samples_per_epoch`` (see the module documentation).
    """

    kind = "MixtureDataset"

    def __init__(
        self,
        weights: "Mapping[str | os.PathLike[str] | TokenDataset, float] | Sequence[tuple[str | os.PathLike[str] | TokenDataset, float]]",
        *,
        split: str = "train",
        seq_len: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        samples_per_epoch: int | None = None,
        pack_sequences: bool = False,
        align_to_bos: bool = False,
        overflow: Overflow = "skip",
        worker_id: int = 0,
        num_workers: int = 1,
        block_size: int = 1,
        shuffle_group: int = 8,
        drop_last: bool = False,
        infinite: bool = False,
        catalog: Catalog | str | os.PathLike[str] | None = None,
        verify: bool = False,
    ) -> None:
        entries = _check_weights(weights)
        components: list[TokenDataset] = []
        for key, _ in entries:
            if isinstance(key, TokenDataset):
                components.append(key)
            else:
                if seq_len is None:
                    raise ValueError("seq_len is required (the number of input tokens per sample)")
                components.append(
                    TokenDataset(
                        key,
                        split=split,
                        seq_len=seq_len,
                        pack_sequences=pack_sequences,
                        align_to_bos=align_to_bos,
                        overflow=overflow,
                        catalog=catalog,
                        verify=verify,
                    )
                )
        first = components[0]
        for ds in components[1:]:
            for attr in ("seq_len", "pack_sequences"):
                if getattr(ds, attr) != getattr(first, attr):
                    raise ValueError(
                        f"mixture components disagree on {attr}: {first.shards.name} has {getattr(first, attr)}, "
                        f"{ds.shards.name} has {getattr(ds, attr)}; samples of one batch must have the same layout"
                    )
        if seq_len is not None and seq_len != first.seq_len:
            raise ValueError(f"seq_len={seq_len} differs from the given datasets' seq_len={first.seq_len}")
        tokenizers = {ds.shards.tokenizer for ds in components if ds.shards.tokenizer is not None}
        if len(tokenizers) > 1:
            raise ValueError(
                f"mixture components use different tokenizers ({', '.join(sorted(tokenizers))}); their token ids "
                "mean different things and cannot be mixed"
            )
        self.components = components
        self.seq_len = first.seq_len
        total_w = sum(w for _, w in entries)
        self.weights = np.array([w / total_w for _, w in entries], dtype=np.float64)
        """The normalized weights, in the order given."""
        sizes = np.array([len(ds) for ds in components], dtype=np.int64)
        if samples_per_epoch is None:
            m = int(min(math.floor(n / p + 1e-9) for n, p in zip(sizes.tolist(), self.weights.tolist())))
            counts = mixture_counts(self.weights, m)
            while m > 1 and np.any(counts > sizes):  # float rounding at the edge: step back
                m -= 1
                counts = mixture_counts(self.weights, m)
        else:
            m = _check_int("samples_per_epoch", samples_per_epoch, minimum=1)
            counts = mixture_counts(self.weights, m)
        for (key, w), c in zip(entries, counts.tolist()):
            if c < 1:
                raise ValueError(
                    f"the weight of {_name(key)} ({w / total_w:.3g} after normalizing) gives it no sample in an epoch "
                    f"of {m} samples; raise its weight or samples_per_epoch"
                )
        self.epoch_samples = m
        self.counts = counts
        """Samples each component contributes per epoch (sums to ``epoch_samples``)."""
        self._bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._stride = coprime_stride(m)
        self._sizes = sizes
        self._orders: dict[tuple[int, int], EpochOrder] = {}
        self._init_stream(
            rank=rank,
            world_size=world_size,
            worker_id=worker_id,
            num_workers=num_workers,
            block_size=block_size,
            seed=seed,
            shuffle=shuffle,
            shuffle_group=shuffle_group,
            drop_last=drop_last,
            infinite=infinite,
        )

    def __repr__(self) -> str:
        parts = ", ".join(f"{ds.shards.name!r}: {w:.3g}" for ds, w in zip(self.components, self.weights))
        return f"MixtureDataset({{{parts}}}, seq_len={self.seq_len}, samples_per_epoch={self.epoch_samples}, rank={self.rank}/{self.world_size})"

    def _order(self, component: int, epoch: int) -> EpochOrder:
        key = (component, epoch)
        order = self._orders.get(key)
        if order is None:
            order = EpochOrder(
                self.components[component].sample_offsets,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                group=self.shuffle_group,
                salt=component + 1,
            )
            if len(self._orders) >= 4 * len(self.components):
                self._orders.clear()
            self._orders[key] = order
        return order

    def _resolve(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = _mulmod(positions, self._stride, self.epoch_samples)
        comps = np.searchsorted(self._bounds, y, side="right") - 1
        ids = np.empty_like(positions)
        for d in np.unique(comps).tolist():
            mask = comps == d
            # This component's own stream position, then its epoch and offset there.
            cpos = epoch * int(self.counts[d]) + (y[mask] - self._bounds[d])
            cepochs, offs = np.divmod(cpos, int(self._sizes[d]))
            out = np.empty_like(cpos)
            for ce in np.unique(cepochs).tolist():
                sel = cepochs == ce
                out[sel] = self._order(d, ce)(offs[sel])
            ids[mask] = out
        return comps, ids

    def _get(self, component: int, sample: int) -> dict[str, np.ndarray]:
        return self.components[component][sample]

    def indices(
        self,
        start: int | None = None,
        stop: int | None = None,
        *,
        worker_id: int | None = None,
        num_workers: int | None = None,
        block_size: int | None = None,
    ) -> Iterator[tuple[int, int]]:
        """``(component, index)`` of every sample this worker reads in ``[start, stop)`` (default: the pass)."""
        first, end = self.pass_bounds(start)
        for _, comps, ids in self._keys(
            first,
            end if stop is None else stop,
            self.worker_id if worker_id is None else worker_id,
            self.num_workers if num_workers is None else num_workers,
            self.block_size if block_size is None else block_size,
        ):
            yield from zip(comps.tolist(), ids.tolist())

    def _check_fields(self) -> dict[str, Any]:
        return {
            "components": [ds.fingerprint for ds in self.components],
            "weights": self.weights.tolist(),
            "epoch_samples": self.epoch_samples,
            **super()._check_fields(),
        }
