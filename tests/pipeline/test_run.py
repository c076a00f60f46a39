"""Running the stages: determinism across workers and backends, and resuming an interrupted build through build()."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.builds import files_of, stable_manifest
from support.paths import SAMPLE

from shardflow.pipeline import build, make_layout, plan_build, tokenize_unit, write_shard
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.manifest import read_manifest

OPTIONS = dict(name="det", shard_tokens=30_011, val_fraction=0.2, seed=7)


def _split_texts(b) -> dict[str, list[str]]:
    v = b.open()
    return {s: [v.split(s).text(i) for i in range(v.split(s).num_documents)] for s in v.splits}


@pytest.mark.slow
def test_identical_output_for_1_and_2_workers_and_both_backends(built, tmp_path):
    # unit_bytes=1: one work unit per row group (4), so 2 workers really run units in parallel.
    a = built(SAMPLE, workers=1, backend="tiktoken", unit_bytes=1, root=tmp_path / "a", **OPTIONS)
    b = built(SAMPLE, workers=2, backend="gigatoken", unit_bytes=1, batch_rows=5, root=tmp_path / "b", **OPTIONS)
    c = built(SAMPLE, workers=2, backend="tiktoken", unit_bytes=1, root=tmp_path / "c", **OPTIONS)
    assert read_manifest(a.directory).tokenized_info["backend"] == "tiktoken"
    assert read_manifest(b.directory).tokenized_info["backend"] == "gigatoken"
    ref = files_of(a.directory)
    assert len(ref) > 6
    assert files_of(b.directory) == ref
    assert files_of(c.directory) == ref
    sa, sb, sc = (stable_manifest(x.directory) for x in (a, b, c))
    assert sb == sa == sc  # the build key too: the backend is not in it
    assert a.ref == b.ref == c.ref == "det@v1"


@pytest.mark.slow
def test_interrupted_build_resumes_to_the_same_bytes(built, tmp_path, monkeypatch):
    import shardflow.pipeline.tokenize as tokenize_mod

    fresh = built(SAMPLE, name="res", shard_tokens=40_000, unit_bytes=1, root=tmp_path / "fresh")
    config = BuildConfig(name="res", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1)
    root = tmp_path / "resumed"
    plan = plan_build(config, data_root=root / "data", catalog=root / "catalog")
    assert len(plan.units) == 4
    # Killed after two of the four units: the layout refuses to run on an incomplete tokenization.
    tokenize_unit(plan, 0)
    tokenize_unit(plan.staging, 2)
    with pytest.raises(ConfigError, match=r"work unit 1 \(sample.parquet\) is not tokenized; the layout needs every unit"):
        make_layout(plan)
    # A stale temporary file from a killed writer is ignored and replaced.
    (Path(plan.staging) / "parts" / ".unit-000001.tok.tmp-999999").write_bytes(b"junk")
    read: list[int] = []
    real = tokenize_mod.iter_text_batches

    def counting(inp, unit, **kw):
        read.append(unit.index)
        return real(inp, unit, **kw)

    monkeypatch.setattr(tokenize_mod, "iter_text_batches", counting)
    result = build(config, data_root=root / "data", catalog=root / "catalog")
    assert sorted(read) == [1, 3]  # build() tokenized only the missing units
    assert result.ref == "res@v1" and result.created
    assert files_of(Path(result.manifest_path).parent) == files_of(fresh.directory)
    assert not Path(plan.staging).exists()


@pytest.mark.slow
def test_build_resumes_after_the_layout_and_some_shards(built, tmp_path, monkeypatch):
    import shardflow.pipeline.write as write_mod

    fresh = built(SAMPLE, name="res", shard_tokens=40_000, unit_bytes=1, root=tmp_path / "fresh")
    config = BuildConfig(name="res", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1)
    root = tmp_path / "resumed"
    plan = plan_build(config, data_root=root / "data", catalog=root / "catalog")
    for u in range(len(plan.units)):
        tokenize_unit(plan, u)
    layout = make_layout(plan)
    assert layout.shard_jobs() == [("train", k) for k in range(layout.splits["train"].shards)]
    write_shard(plan, "train", 1)
    (Path(plan.staging) / "out" / "train" / ".res_train_000000.bin.tmp-999999").write_bytes(b"junk")
    written: list[str] = []
    real = write_mod.link_or_copy

    def counting(src: Path, dest: Path) -> None:  # train shards are the pieces, linked under their names
        written.append(Path(dest).name)
        real(src, dest)

    monkeypatch.setattr(write_mod, "link_or_copy", counting)
    result = build(config, data_root=root / "data", catalog=root / "catalog")
    assert "res_train_000001.bin" not in written and "res_train_000000.bin" in written
    assert files_of(Path(result.manifest_path).parent) == files_of(fresh.directory)
