"""Weighted mixtures of datasets: deterministic, exact per epoch, streamed like ``StreamingTokenDataset``.

    mix = MixtureDataset({"web@latest": 0.7, "code@v3": 0.3}, split="train", seq_len=1024, seed=0)

Epochs, exact counts, the Kronecker interleaving, phases and resume: docs/RUNTIME.md ("Mixtures").
Each component is read as its own endless stream of epochs, shuffled from ``(seed, component,
epoch)``: mixture epoch ``e`` reads positions ``[e * n_d, (e + 1) * n_d)`` of it, so a component
smaller than its share wraps into its next epoch and a larger one moves on through its data. Stream
positions are computed from the schedule (a few additions per phase), so resuming anywhere costs
the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple, Sequence, TypeAlias, Union

import numpy as np

from .dataset import TokenDataset
from .mixture_weights import check_phases, check_weights, default_epoch, mixture_counts, mulmod, normalized, source_name
from .options import DATASET_OPTIONS, MIXTURE_OPTIONS, ReadOptions, check_int
from .order import EpochOrder, coprime_stride
from .remote import is_remote_ref
from .streaming import SampleStream, check_split

__all__ = ["MixtureDataset", "MixturePhase", "mixture_counts"]

Source: TypeAlias = Union[str, "os.PathLike[str]", TokenDataset]
"""A mixture's dataset: a reference, a version directory, or an opened ``TokenDataset``."""
Weights: TypeAlias = Union[Mapping[Source, float], Sequence[tuple[Source, float]]]
"""``{source: weight}`` or ``(source, weight)`` pairs."""

@dataclass(frozen=True, kw_only=True)
class MixturePhase:
    """One phase of a mixture's schedule; a mixture without ``phases`` has one, from step 0."""

    start: int
    """Global sample position where the phase begins (samples of all ranks, from the start)."""
    weights: tuple[float, ...]
    """Normalized weights, in the order of ``MixtureDataset.components`` (0: not read in this phase)."""
    epoch_samples: int
    """Samples of each full epoch of the phase (all ranks); its last epoch may be shorter."""
    counts: tuple[int, ...]
    """Samples each component contributes to a full epoch (sums to ``epoch_samples``)."""

    def __post_init__(self) -> None:
        if self.start < 0 or self.epoch_samples < 1 or sum(self.counts) != self.epoch_samples:
            raise ValueError(f"inconsistent mixture phase: {self!r}")


class _Run(NamedTuple):
    """Consecutive epochs of one size in one phase: what resolving a position there needs."""

    phase: int
    size: int  # samples per epoch, all ranks
    stride: int  # of the Kronecker interleaving
    counts: np.ndarray  # per component, per epoch
    bounds: np.ndarray  # each component's interval of the interleaved positions
    base: np.ndarray  # each component's stream position at the run's first epoch


def _plan_phase(
    *,
    step: int,
    probs: np.ndarray,
    end: int | None,
    keys: list[Any],
    sizes: np.ndarray,
    samples_per_epoch: int | None,
    world_size: int,
    phased: bool,
) -> MixturePhase:
    """The phase from ``step`` to ``end`` (None: endless): its epoch size and exact counts, checked."""
    where = f" in the phase at step {step}" if phased else ""
    m = default_epoch(probs, sizes) if samples_per_epoch is None else samples_per_epoch
    counts = mixture_counts(probs, m)
    for key, p, c in zip(keys, probs.tolist(), counts.tolist()):
        if p > 0 and c < 1:
            raise ValueError(
                f"the weight of {source_name(key)}{where} ({p:.3g} after normalizing) gives it no sample in an epoch "
                f"of {m} samples; raise its weight or samples_per_epoch"
            )
    if end is None or end - step >= m:  # it has full epochs (else it is a single short one)
        check_split(m, world_size)
    return MixturePhase(start=step, weights=tuple(probs.tolist()), epoch_samples=m, counts=tuple(counts.tolist()))


def _lay_out(phases: tuple[MixturePhase, ...]) -> list[tuple[_Run, int | None]]:
    """The runs of equal epochs, phase by phase, with how many epochs each has (None: endless).

    A phase has its full epochs, then, if its length is not a multiple of its
    epoch size, one short epoch of the remainder with exact counts of its own.
    Each run records every component's stream position at its first epoch:
    the sum of the counts of all epochs before it.
    """
    runs: list[tuple[_Run, int | None]] = []
    base = np.zeros(len(phases[0].weights), dtype=np.int64)
    for k, phase in enumerate(phases):
        m = phase.epoch_samples
        full: int | None = None
        rest = 0
        if k + 1 < len(phases):
            full, rest = divmod(phases[k + 1].start - phase.start, m)
        pieces = [(m, full, np.array(phase.counts, dtype=np.int64))]
        if rest:
            pieces.append((rest, 1, mixture_counts(np.array(phase.weights), rest)))
        for size, count, counts in pieces:
            if count == 0:
                continue
            bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
            runs.append((_Run(k, size, coprime_stride(size), counts, bounds, base), count))
            if count is not None:
                base = base + count * counts
    return runs


class MixtureDataset(SampleStream):
    """Samples drawn from several datasets in fixed proportions, as an epoch stream.

    ``weights`` maps references (or ``TokenDataset`` objects) to positive
    weights (normalized to sum to 1). Or ``phases``, a list of ``(step,
    weights)`` from step 0 in increasing order, changes the weights at global
    sample positions (every phase names the same datasets; a weight of 0
    leaves one out of a phase). The other options (keywords or
    ``options=ReadOptions(...)``, ``MIXTURE_OPTIONS``) are those of
    ``StreamingTokenDataset`` but the plain-directory ones and
    ``cache_limit_bytes``, and apply to every component, plus
    ``samples_per_epoch`` (every phase's, when given; see docs/RUNTIME.md).
    A component on object storage (a version URL, or a
    name with ``catalog="s3://..."``) is fetched into ``cache_dir`` at open, as
    ``TokenDataset`` does.
    """

    kind = "MixtureDataset"

    def __init__(
        self,
        weights: Weights | None = None,
        *,
        phases: Sequence[tuple[int, Weights]] | None = None,
        options: ReadOptions | None = None,
        **kwargs: Any,
    ) -> None:
        opts = ReadOptions.collect("MixtureDataset.__init__", MIXTURE_OPTIONS, options, kwargs)
        if (weights is None) == (phases is None):
            raise ValueError(
                "give a mixture either weights ({ref: weight, ...}) or phases=[(0, {ref: weight, ...}), "
                f"(step, {{...}}), ...], {'not both' if phases is not None else 'none was given'}"
            )
        if phases is None:
            entries = check_weights(weights)
            keys = [key for key, _ in entries]
            schedule = [(0, normalized([w for _, w in entries]))]
        else:
            keys, schedule = check_phases(phases)
        components: list[TokenDataset] = []
        for key in keys:
            if isinstance(key, TokenDataset):
                components.append(key)
            else:
                if opts.seq_len is None:
                    raise ValueError("seq_len is required (the number of input tokens per sample)")
                # A component on object storage is fetched at open (TokenDataset); a local one ignores cache_dir.
                cache_dir = opts.cache_dir if is_remote_ref(key, opts.catalog) else None
                components.append(TokenDataset(key, options=opts.only(DATASET_OPTIONS, cache_dir=cache_dir)))
        first = components[0]
        for ds in components[1:]:
            for attr in ("seq_len", "pack_sequences"):
                if getattr(ds, attr) != getattr(first, attr):
                    raise ValueError(
                        f"mixture components disagree on {attr}: {first.shards.name} has {getattr(first, attr)}, "
                        f"{ds.shards.name} has {getattr(ds, attr)}; samples of one batch must have the same layout"
                    )
        if opts.seq_len is not None and opts.seq_len != first.seq_len:
            raise ValueError(f"seq_len={opts.seq_len} differs from the given datasets' seq_len={first.seq_len}")
        tokenizers = {ds.shards.tokenizer for ds in components if ds.shards.tokenizer is not None}
        if len(tokenizers) > 1:
            raise ValueError(
                f"mixture components use different tokenizers ({', '.join(sorted(tokenizers))}); their token ids "
                "mean different things and cannot be mixed"
            )
        self.components = components
        self.seq_len = first.seq_len
        sizes = np.array([len(ds) for ds in components], dtype=np.int64)
        ends: list[int | None] = [step for step, _ in schedule[1:]]
        self.phases = tuple(
            _plan_phase(
                step=step,
                probs=probs,
                end=end,
                keys=keys,
                sizes=sizes,
                samples_per_epoch=opts.samples_per_epoch,
                world_size=opts.world_size,
                phased=len(schedule) > 1,
            )
            for (step, probs), end in zip(schedule, ends + [None])
        )
        """The schedule: one phase for plain weights."""
        self._sizes = sizes
        runs = _lay_out(self.phases)
        self._runs = [run for run, _ in runs]
        self._orders: dict[tuple[int, int], EpochOrder] = {}
        self._init_stream(opts, runs=[(run.size, count) for run, count in runs])

    def __repr__(self) -> str:
        def weights(phase: MixturePhase) -> str:
            return "{" + ", ".join(f"{ds.shards.name!r}: {w:.3g}" for ds, w in zip(self.components, phase.weights)) + "}"

        if len(self.phases) == 1:
            spec = f"{weights(self.phases[0])}, seq_len={self.seq_len}, samples_per_epoch={self.epoch_samples}"
        else:
            spec = "phases=[" + ", ".join(f"({p.start}, {weights(p)})" for p in self.phases) + f"], seq_len={self.seq_len}"
        return f"MixtureDataset({spec}, rank={self.rank}/{self.world_size})"

    # -- the current phase and epoch ----------------------------------------------

    def _run(self) -> _Run:
        return self._runs[self._layout.run_at(self._position)]

    @property
    def phase(self) -> int:
        """Index in ``phases`` of the phase of the next sample of this rank."""
        return self._run().phase

    def phase_start(self, phase: int) -> int:
        """Position in this rank's stream where ``phases[phase]`` begins: this rank's sample count there."""
        k = check_int("phase", phase, minimum=0)
        if k >= len(self.phases):
            raise ValueError(f"phase={phase} is past the last phase; the schedule has {len(self.phases)} (0 to {len(self.phases) - 1})")
        first_run = next(u for u, run in enumerate(self._runs) if run.phase == k)  # every phase has a run
        return int(self._layout.start[first_run])

    @property
    def weights(self) -> np.ndarray:
        """The normalized weights of the current phase, in the order of ``components``."""
        return np.array(self.phases[self.phase].weights, dtype=np.float64)

    @property
    def epoch_samples(self) -> int:  # type: ignore[override]
        """Samples of the current epoch, all ranks (the same for every epoch of a plain mixture)."""
        return self._run().size

    @property
    def counts(self) -> np.ndarray:
        """Samples each component contributes to the current epoch (sums to ``epoch_samples``)."""
        return self._run().counts.copy()

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
        u = self._layout.run_of_epoch(epoch)
        run = self._runs[u]
        nth = epoch - int(self._layout.first_epoch[u])  # epochs of this run before this one
        y = mulmod(positions, run.stride, run.size)
        comps = np.searchsorted(run.bounds, y, side="right") - 1
        ids = np.empty_like(positions)
        for d in np.unique(comps).tolist():
            mask = comps == d
            # This component's own stream position, then its epoch and offset there.
            cpos = int(run.base[d]) + nth * int(run.counts[d]) + (y[mask] - run.bounds[d])
            cepochs, offs = np.divmod(cpos, int(self._sizes[d]))
            out = np.empty_like(cpos)
            for ce in np.unique(cepochs).tolist():
                sel = cepochs == ce
                out[sel] = self._order(d, ce)(offs[sel])
            ids[mask] = out
        return comps, ids

    def _get(self, component: int, sample: int) -> dict[str, np.ndarray]:
        return self.components[component][sample]

    def _sample_ids(self, comps: np.ndarray, ids: np.ndarray) -> Iterable[tuple[int, int]]:
        """``(component, index)`` pairs."""
        return zip(comps.tolist(), ids.tolist())

    def _check_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"components": [ds.fingerprint for ds in self.components]}
        if len(self.phases) == 1:  # as before phases existed: older states still load
            fields["weights"] = list(self.phases[0].weights)
            fields["epoch_samples"] = self.phases[0].epoch_samples
        else:
            fields["phases"] = [
                {"step": p.start, "weights": list(p.weights), "epoch_samples": p.epoch_samples} for p in self.phases
            ]
        return {**fields, **super()._check_fields()}
