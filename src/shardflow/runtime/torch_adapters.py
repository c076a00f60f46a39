"""PyTorch adapters: the runtime's datasets as ``torch.utils.data`` datasets returning tensors.

Optional: needs ``pip install 'shardflow[torch]'``.

* ``TorchTokenDataset(ds)`` -- map-style ``Dataset`` over a ``TokenDataset``;
  packed samples need ``collate_fn=torch_collate``.
* ``TorchStreamingDataset(stream, batch_size=B)`` -- ``IterableDataset`` over a
  ``StreamingTokenDataset`` or ``MixtureDataset``, split over the loader's
  workers in blocks of ``B``, the order the loader collects them in.
* ``StreamingLoader(stream, batch_size=B, num_workers=W)`` -- builds that
  DataLoader for each pass and advances the stream's position by each batch it
  hands out, so ``state_dict()`` after any batch resumes exactly after it.

Why that is exact with any number of workers: docs/RUNTIME.md ("Exact resume").
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

try:
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError(
        "shardflow.runtime.torch_adapters needs PyTorch: pip install 'shardflow[torch]' "
        "(or pip install torch==2.13.0, the CPU build; a bare 'pip install torch' pulls a multi-GB CUDA build). "
        "The numpy datasets in shardflow.runtime work without it"
    ) from exc

from .dataset import TokenDataset
from .options import check_int
from .packing import collate
from .streaming import SampleStream

__all__ = ["TorchTokenDataset", "TorchStreamingDataset", "StreamingLoader", "torch_collate", "to_tensors"]


def to_tensors(sample: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A sample's numpy arrays as tensors (sharing memory; the arrays are fresh copies)."""
    return {k: torch.from_numpy(v) for k, v in sample.items()}


def torch_collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Batch samples (numpy or tensors) into tensors; packed ``cu_seqlens`` are flattened for the batch.

    Fixed-size fields are stacked to ``[B, seq_len]``; ``cu_seqlens`` becomes one
    int32 vector over the ``B * seq_len`` tokens and ``max_seqlen`` its longest
    segment, as ``flash_attn_varlen_func`` takes them.
    """
    arrays = [{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in samples]
    return to_tensors(collate(arrays))


class TorchTokenDataset(Dataset):  # type: ignore[type-arg]
    """A ``TokenDataset`` as a map-style PyTorch dataset of tensor dicts.

    Pass a ``TokenDataset``, or a reference and ``TokenDataset``'s keyword options.
    """

    def __init__(self, dataset: "TokenDataset | str", **options: Any) -> None:
        if isinstance(dataset, TokenDataset):
            if options:
                raise ValueError(f"options {sorted(options)} apply when building a dataset from a reference, not to a TokenDataset")
            self.dataset = dataset
        else:
            self.dataset = TokenDataset(dataset, **options)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return to_tensors(self.dataset[index])

    @property
    def collate_fn(self) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
        """``torch_collate``: needed when packing (``cu_seqlens`` differ in length)."""
        return torch_collate


class TorchStreamingDataset(IterableDataset):  # type: ignore[type-arg]
    """A ``StreamingTokenDataset`` / ``MixtureDataset`` as a PyTorch ``IterableDataset``.

    ``batch_size`` must be the DataLoader's: it is the block size of the
    round-robin split over workers. Iterating reads one pass from the stream's
    position at the time the DataLoader's iterator is created; it does not move
    the position (``StreamingLoader`` does, for the batches it delivers).
    """

    def __init__(self, stream: SampleStream, *, batch_size: int = 1) -> None:
        if not isinstance(stream, SampleStream):
            raise TypeError(f"expected a StreamingTokenDataset or MixtureDataset, not {type(stream).__name__}")
        if stream.num_workers != 1:
            raise ValueError(
                f"the stream is already split over num_workers={stream.num_workers}; the DataLoader splits it "
                "over its workers, so build the stream with the default worker_id=0, num_workers=1"
            )
        self.stream = stream
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self._start: int | None = None
        self._iterated_in_worker = False

    def start_at(self, position: int | None) -> None:
        """Read passes from ``position`` instead of the stream's current position (None: follow the stream)."""
        self._start = position

    def __len__(self) -> int:
        """Samples of the rank stream in one pass (all workers together)."""
        return self.stream.pass_length(start=self._start)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            # With persistent_workers=True a worker's copy of this object would
            # start every later pass from the position it was created with:
            # the same data again. Refuse rather than repeat data silently.
            if self._iterated_in_worker:
                raise RuntimeError(
                    "TorchStreamingDataset was iterated twice in one DataLoader worker (persistent_workers=True?); "
                    "the worker's copy cannot see the stream's new position. Use persistent_workers=False, or "
                    "StreamingLoader, which starts each pass from the current position"
                )
            self._iterated_in_worker = True
        start, stop = self.stream.pass_bounds(self._start)
        for sample in self.stream.iter_range(
            start, stop, worker_id=worker_id, num_workers=num_workers, block_size=self.batch_size
        ):
            yield to_tensors(sample)


class StreamingLoader:
    """DataLoader passes over a stream, with an exact, resumable position.

        loader = StreamingLoader(stream, batch_size=8, num_workers=2)
        for batch in loader:             # one pass: the rest of the current epoch
            ...
            ckpt = {"data": loader.state_dict(), ...}
        loader.load_state_dict(ckpt["data"])   # on a fresh stream and loader

    Each pass builds a ``torch.utils.data.DataLoader`` over a
    ``TorchStreamingDataset`` starting at the stream's position; every batch
    handed out advances it by the batch's size before it is yielded. Extra
    keyword arguments go to the DataLoader (``pin_memory``, ``prefetch_factor``,
    ``multiprocessing_context``, ``timeout``, ``worker_init_fn``, ...).
    """

    def __init__(
        self,
        stream: SampleStream,
        *,
        batch_size: int,
        num_workers: int = 0,
        collate_fn: Callable[[list[dict[str, Any]]], Any] = torch_collate,
        **loader_options: Any,
    ) -> None:
        for bad in ("persistent_workers", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if bad in loader_options:
                raise ValueError(
                    f"{bad} is not a StreamingLoader option: the stream decides order, shuffling and epochs, and "
                    "each pass starts fresh workers at the exact position"
                )
        if loader_options.get("in_order", True) is not True:
            raise ValueError("in_order=False would deliver batches out of the stream's order; the position would be wrong")
        self.stream = stream
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        self.collate_fn = collate_fn
        self.loader_options = loader_options
        self._dataset = TorchStreamingDataset(stream, batch_size=self.batch_size)

    def __len__(self) -> int:
        """Batches left in the current pass."""
        return -(-self.stream.pass_length() // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        start, stop = self.stream.pass_bounds()
        self._dataset.start_at(start)
        loader = DataLoader(
            self._dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            **self.loader_options,
        )
        try:
            for batch in loader:
                n = _batch_len(batch)
                self.stream.advance(n)
                yield batch
        finally:
            self._dataset.start_at(None)
        if stop is not None and self.stream.position != stop:
            raise RuntimeError(
                f"the pass ended at position {self.stream.position}, not at {stop}: the loader's batches do not "
                "match the stream (was collate_fn changed to drop or add samples?)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The stream's state: where the next batch starts."""
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict) and "input_ids" in batch:
        return int(batch["input_ids"].shape[0])
    raise TypeError(
        "StreamingLoader counts samples by batch['input_ids'].shape[0]; a custom collate_fn must keep that key"
    )
