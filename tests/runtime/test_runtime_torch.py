"""The PyTorch adapters, through real DataLoaders with 0 and 2 workers, and exact resume through them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from shardflow.runtime import MixtureDataset, StreamingTokenDataset, TokenDataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shardflow.runtime.torch_adapters import (  # noqa: E402
    StreamingLoader,
    TorchStreamingDataset,
    TorchTokenDataset,
    torch_collate,
)

SRC = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src")


def test_import_runtime_does_not_import_torch():
    code = "import sys, shardflow.runtime; from shardflow.runtime import *; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": SRC, "PATH": ""})


def test_missing_torch_is_explained():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import shardflow.runtime.torch_adapters\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": SRC, "PATH": ""}, capture_output=True, text=True)
    assert "pip install 'shardflow[torch]'" in out.stdout and "torch==2.13.0" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pack", [False, True])
def test_map_style_through_a_dataloader(cat, num_workers, pack):
    ds = TokenDataset("wiki@v1", seq_len=256, pack_sequences=pack, catalog=cat.path)
    tds = TorchTokenDataset(ds)
    loader = DataLoader(tds, batch_size=5, num_workers=num_workers, collate_fn=tds.collate_fn, shuffle=False)
    n = 0
    for b, batch in enumerate(loader):
        expected = torch_collate([ds[i] for i in range(b * 5, min(b * 5 + 5, len(ds)))])
        assert batch.keys() == expected.keys()
        for key in batch:
            assert torch.equal(batch[key], expected[key]), key
        assert batch["input_ids"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
        if pack:
            assert batch["cu_seqlens"].dtype == torch.int32
        n += len(batch["input_ids"])
    assert n == len(ds)


def test_map_style_with_a_shuffling_sampler(cat):
    ds = TokenDataset("wiki@v1", seq_len=512, catalog=cat.path)
    loader = DataLoader(TorchTokenDataset(ds), batch_size=8, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0))
    rows = {tuple(r.tolist()) for batch in loader for r in batch["input_ids"]}
    assert rows == {tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))}


def rank_stream(make, n: int) -> list[tuple]:
    """The first ``n`` samples of the rank stream read with the numpy core, passes in a row."""
    s = make()
    out: list[tuple] = []
    while len(out) < n:
        for x in s:
            out.append(tuple(x["input_ids"][:8].tolist()) + tuple(x["labels"][-4:].tolist()))
            if len(out) == n:
                break
    return out


def rows(batch) -> list[tuple]:
    return [tuple(a[:8].tolist()) + tuple(b[-4:].tolist()) for a, b in zip(batch["input_ids"], batch["labels"])]


def read_loader(loader: StreamingLoader, n_batches: int) -> list[tuple]:
    out: list[tuple] = []
    while n_batches:
        got = False
        for batch in loader:
            got = True
            out.extend(rows(batch))
            n_batches -= 1
            if not n_batches:
                break
        assert got
    return out


def make_stream(cat, **kw):
    return StreamingTokenDataset("wiki@v1", seq_len=384, catalog=cat.path, seed=3, world_size=2, rank=0, **kw)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streaming_loader_delivers_the_rank_stream_in_order(cat, num_workers):
    stream = make_stream(cat)
    n = stream.samples_per_epoch
    loader = StreamingLoader(stream, batch_size=4, num_workers=num_workers)
    assert len(loader) == -(-n // 4)
    got = [r for batch in loader for r in rows(batch)]
    assert got == rank_stream(lambda: make_stream(cat), n)
    assert stream.position == n and stream.epoch == 1


@pytest.mark.slow
@pytest.mark.parametrize("first_workers,second_workers", [(2, 2), (2, 0), (0, 2)])
def test_resume_through_the_loader(cat, first_workers, second_workers):
    n = make_stream(cat).samples_per_epoch
    batch = 4
    total_batches = 2 * (-(-n // batch)) + 3
    reference = [r for b in range(1) for r in read_loader(StreamingLoader(make_stream(cat), batch_size=batch), total_batches)]
    # Mid-epoch, then again within the same epoch, then across the epoch boundary.
    cut1, cut2 = 3, (n // batch) - 2
    a = StreamingLoader(make_stream(cat), batch_size=batch, num_workers=first_workers)
    part1 = read_loader(a, cut1)
    b = StreamingLoader(make_stream(cat), batch_size=batch, num_workers=second_workers)
    b.load_state_dict(a.state_dict())
    part2 = read_loader(b, cut2 - cut1)
    c = StreamingLoader(make_stream(cat), batch_size=batch, num_workers=first_workers)
    c.load_state_dict(b.state_dict())
    rest = read_loader(c, total_batches - cut2)
    assert part1 + part2 + rest == reference


@pytest.mark.slow
def test_plain_dataloader_with_matching_batch_size(cat):
    """Without StreamingLoader: DataLoader(batch_size=B) over TorchStreamingDataset(batch_size=B) is in order too."""
    stream = make_stream(cat)
    tds = TorchStreamingDataset(stream, batch_size=3)
    loader = DataLoader(tds, batch_size=3, num_workers=2, collate_fn=torch_collate)
    n = stream.samples_per_epoch
    reference = rank_stream(lambda: make_stream(cat), 2 * n)
    got = [r for batch in loader for r in rows(batch)]
    assert got == reference[:n]
    assert len(tds) == n
    stream.set_epoch(1)  # the DistributedSampler-style way to move a plain DataLoader on
    again = [r for batch in loader for r in rows(batch)]
    assert again == reference[n:]


def test_persistent_workers_are_refused_rather_than_repeating_data(cat):
    tds = TorchStreamingDataset(make_stream(cat), batch_size=2)
    loader = DataLoader(tds, batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    with pytest.raises(RuntimeError, match="persistent_workers"):
        list(loader)
    with pytest.raises(ValueError, match="persistent_workers is not a StreamingLoader option"):
        StreamingLoader(make_stream(cat), batch_size=2, persistent_workers=True)
    with pytest.raises(ValueError, match="already split over num_workers=2"):
        TorchStreamingDataset(make_stream(cat, num_workers=2))


@pytest.mark.slow
def test_mixture_through_the_loader(cat):
    def make():
        return MixtureDataset({"wiki@v1": 0.7, "eos@v1": 0.3}, seq_len=256, catalog=cat.path, seed=1, pack_sequences=True)

    loader = StreamingLoader(make(), batch_size=6, num_workers=2)
    first = read_loader(loader, 5)
    resumed = StreamingLoader(make(), batch_size=6, num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    rest = read_loader(resumed, 5)
    assert first + rest == read_loader(StreamingLoader(make(), batch_size=6), 10)
    batch = next(iter(StreamingLoader(make(), batch_size=6)))
    assert batch["cu_seqlens"][-1] == 6 * 256 and batch["position_ids"].shape == (6, 256)


@pytest.mark.slow
def test_phased_mixture_resumes_across_the_boundary_through_the_loader(cat):
    """Five batches of 6 end before the phase boundary at sample 40; the resumed loader reads across it."""
    phases = [(0, {"wiki@v1": 0.7, "eos@v1": 0.3}), (40, {"wiki@v1": 0.2, "eos@v1": 0.8})]

    def make():
        return MixtureDataset(phases=phases, seq_len=256, catalog=cat.path, seed=1, infinite=True)

    loader = StreamingLoader(make(), batch_size=6, num_workers=2)
    first = read_loader(loader, 5)
    resumed = StreamingLoader(make(), batch_size=6, num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    rest = read_loader(resumed, 5)
    assert resumed.stream.phase == 1
    assert first + rest == read_loader(StreamingLoader(make(), batch_size=6), 10)


def test_tensors_share_nothing_with_the_maps(cat):
    ds = TorchTokenDataset("wiki@v1", seq_len=64, catalog=cat.path)
    item = ds[0]
    item["labels"][:] = -100
    assert not torch.equal(ds[0]["labels"], item["labels"])
    assert np.array_equal(ds[0]["input_ids"].numpy(), ds.dataset[0]["input_ids"])


@pytest.mark.slow
def test_spawned_workers_get_a_small_copy_and_the_same_order(cat):
    """macOS and CUDA jobs use spawn: the dataset is pickled (no maps, no cached permutations) and reopened."""
    reference = read_loader(StreamingLoader(make_stream(cat), batch_size=4), 6)
    spawned = StreamingLoader(make_stream(cat), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert read_loader(spawned, 6) == reference
