"""Boundary tokens: BOS and/or EOS around every document, chosen by text or id, checked end to end on real data."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from support.builds import files_of
from support.corpus import write_parquet
from support.paths import SAMPLE
from shardflow.pipeline import plan_build
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError, ValidationError
from shardflow.formats import bosidx
from shardflow.manifest import read_manifest
from shardflow.runtime import TokenDataset
from shardflow.tokenizers import load_tokenizer
from shardflow.validation import validate_dir

FIM_PREFIX, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_suffix|>"
TRICKY = [
    f"text with {FIM_PREFIX} and {FIM_SUFFIX} inside, as ordinary text",
    "<|endoftext|>",
    f"{FIM_SUFFIX}{FIM_PREFIX}<|endoftext|> x",
    "a",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """The sample corpus and, after it, documents that hold the boundary tokens' text."""
    d = tmp_path_factory.mktemp("bnd-corpus")
    shutil.copy(SAMPLE, d / "a.parquet")
    write_parquet(d / "b.parquet", TRICKY)
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist() + TRICKY
    return d, [t for t in texts if t]


def _all_documents(version, split: str) -> list[np.ndarray]:
    s = version.split(split)
    return [s.document(i, with_boundary=True) for i in range(s.num_documents)]


def _check_version(b, texts: list[str], bos: int, eos: int) -> None:
    tok = load_tokenizer("cl100k_base", backend="tiktoken")
    v = b.open()
    docs = [d for split in v.splits for d in _all_documents(v, split)]
    assert len(docs) == len(texts)
    by_text: dict[tuple[int, ...], int] = {}
    for text in texts:
        key = tuple([bos, *tok.encode_ordinary(text), eos])
        by_text[key] = by_text.get(key, 0) + 1
    got: dict[tuple[int, ...], int] = {}
    for d in docs:
        got[tuple(d.tolist())] = got.get(tuple(d.tolist()), 0) + 1
    assert got == by_text  # every document is exactly BOS + its reference ids + EOS
    for split in v.splits:
        s = v.split(split)
        assert [s.text(i) for i in range(s.num_documents)] == [
            tok.decode(d[1:-1]) for d in _all_documents(v, split)
        ]
        for k in range(s.num_shards):
            toks = s.shard(k)
            starts = bosidx.read(bosidx.index_path(s.shards.shards[k].path), len(toks)).astype(np.int64)
            # Whole documents (schema 3): each shard opens with a document's BOS and ends with one's EOS.
            assert starts[0] == 0 and toks[-1] == eos
            assert np.all(toks[starts] == bos)
            inner = starts[starts > 0]
            assert np.all(toks[inner - 1] == eos)
            if bos != eos:
                assert np.array_equal(np.flatnonzero(toks == bos), starts)  # every BOS is indexed
    validate_dir(b.directory, published=True, catalog=b.catalog)


@pytest.mark.slow
def test_both_with_chosen_tokens(built, corpus):
    src, texts = corpus
    tok = load_tokenizer("cl100k_base", backend="tiktoken")
    bos, eos = tok.token_id(FIM_PREFIX), tok.token_id(FIM_SUFFIX)
    b = built(src, name="both", boundary="both", bos_token=FIM_PREFIX, eos_token=FIM_SUFFIX,
              shard_tokens=20_000, val_fraction=0.1, unit_bytes=1)
    m = read_manifest(b.directory)
    assert m.boundary == {
        "token": FIM_PREFIX, "token_id": bos, "placement": "both",
        "bos": {"token": FIM_PREFIX, "id": bos}, "eos": {"token": FIM_SUFFIX, "id": eos},
    }
    assert m.config["bos_token"] == FIM_PREFIX and m.config["eos_token"] == FIM_SUFFIX
    assert m.totals["max_token_id"] >= max(bos, eos)
    # --shard-tokens bounds every shard but one of a single longer document.
    entries = [e for split in m.splits.values() for e in split.shards]
    assert len(entries) > 2 and all(e.tokens <= 20_000 or e.documents == 1 for e in entries)
    _check_version(b, texts, bos, eos)
    # Ids name the same tokens: the same bytes (the key differs: the option is spelled differently).
    # (The same unit_bytes too: work units decide where shards are cut.)
    by_id = built(src, name="both", boundary="both", bos_token=str(bos), eos_token=eos,
                  shard_tokens=20_000, val_fraction=0.1, unit_bytes=1, root=b.data_root.parent / "ids")
    assert files_of(by_id.directory) == files_of(b.directory)
    assert read_manifest(by_id.directory).boundary == m.boundary


@pytest.mark.slow
def test_both_with_the_default_token_and_workers(built, corpus):
    """tiktoken's default for both is <|endoftext|>: [E] ids [E], still indexed and validated."""
    src, texts = corpus
    eot = load_tokenizer("cl100k_base", backend="tiktoken").eot_id
    one = built(src, name="dflt", boundary="both", shard_tokens=7_000, unit_bytes=1, workers=1)
    two = built(src, name="dflt", boundary="both", shard_tokens=7_000, unit_bytes=1, workers=2,
                root=one.data_root.parent / "two")
    assert files_of(one.directory) == files_of(two.directory)
    assert read_manifest(one.directory).boundary["bos"] == {"token": "<|endoftext|>", "id": eot}
    _check_version(one, texts, eot, eot)


@pytest.mark.slow
def test_single_placements_keep_their_manifest_and_key(built, tiny_parquet):
    for placement in ("bos", "eos"):
        b = built(tiny_parquet, name=placement, boundary=placement, root=Path(str(tiny_parquet) + f".{placement}"))
        raw = yaml.safe_load((b.directory / "metadata.yaml").read_text())
        assert raw["boundary"] == {"token": "<|endoftext|>", "token_id": 100257, "placement": placement}
        assert "bos_token" not in raw["config"] and "eos_token" not in raw["config"]
    cfg = BuildConfig(name="k", sources=("x",))
    assert "bos_token" not in cfg.key_fields() and "eos_token" not in cfg.key_fields()
    assert BuildConfig(name="k", sources=("x",), bos_token="<|fim_prefix|>").key_fields()["bos_token"] == "<|fim_prefix|>"


@pytest.mark.slow
def test_a_chosen_single_token_is_recorded(built, tiny_parquet, tmp_path):
    b = built(tiny_parquet, name="e", boundary="eos", eos_token=FIM_SUFFIX)
    m = read_manifest(b.directory)
    eos = load_tokenizer("cl100k_base").token_id(FIM_SUFFIX)
    assert m.boundary == {"token": FIM_SUFFIX, "token_id": eos, "placement": "eos", "eos": {"token": FIM_SUFFIX, "id": eos}}
    s = b.open().split("train")
    assert s.text(0) == pq.read_table(tiny_parquet).column("text")[0].as_py()
    assert s.document(0, with_boundary=True)[-1] == eos


@pytest.mark.slow
def test_validation_catches_a_corrupted_boundary(built, corpus, tmp_path):
    src, _ = corpus
    b = built(src, name="bad", boundary="both", bos_token=FIM_PREFIX, eos_token=FIM_SUFFIX, shard_tokens=20_000)
    copy = tmp_path / "copy"
    shutil.copytree(b.directory, copy)
    m = read_manifest(copy)
    shard = copy / m.splits["train"].shards[0].file
    starts = bosidx.read(bosidx.index_path(shard), m.splits["train"].shards[0].tokens)
    assert len(starts) >= 5
    data = bytearray(shard.read_bytes())
    original = bytes(data)
    header = m.format["header_bytes"]
    at = int(starts[3]) - 1  # the EOS closing document 2
    data[header + 4 * at : header + 4 * at + 4] = (11).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=rf"token {at} before it is not the EOS token"):
        validate_dir(copy, checksums=False)
    # A BOS turned into an ordinary token: its document is no longer a start.
    data[header + 4 * at : header + 4 * at + 4] = m.boundary["eos"]["id"].to_bytes(4, "little")
    at = int(starts[4])
    data[header + 4 * at : header + 4 * at + 4] = (11).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=rf"entry 4 points at token {at}, which is not a document start \(BOS token"):
        validate_dir(copy, checksums=False)
    # The shard's last EOS turned into an ordinary token: its last document is cut short.
    data = bytearray(original)
    data[-4:] = (11).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=r"its last token is 11, not the EOS token .*cut short"):
        validate_dir(copy, checksums=False)
    # An index without its first entry: the shard no longer begins with a document.
    shard.write_bytes(original)
    validate_dir(copy, checksums=False)  # the shard restored: valid again
    bosidx.index_path(shard).write_bytes(bosidx.encode(starts[1:]))
    with pytest.raises(ValidationError, match=r"does not begin with a document \(its index does not start with 0\)"):
        validate_dir(copy, checksums=False)


@pytest.mark.slow
def test_same_token_both_validation_catches_a_bad_index(built, tiny_parquet, tmp_path):
    b = built(tiny_parquet, name="same", boundary="both")
    copy = tmp_path / "copy"
    shutil.copytree(b.directory, copy)
    m = read_manifest(copy)
    idx = copy / m.splits["train"].shards[0].index.file
    starts = np.fromfile(idx, dtype="<i4")
    starts[1] -= 1  # now points at the previous document's EOS
    starts.tofile(idx)
    with pytest.raises(ValidationError, match="which is not a document start"):
        validate_dir(copy, checksums=False)


def test_packing_and_alignment_follow_the_document_starts(built, corpus):
    src, _ = corpus
    b = built(src, name="pack", boundary="both", bos_token=FIM_PREFIX, eos_token=FIM_SUFFIX, shard_tokens=20_000)
    v = b.open()
    bos, eos = v.manifest.boundary["bos"]["id"], v.manifest.boundary["eos"]["id"]
    seq = 256
    ds = TokenDataset(b.ref, catalog=b.catalog, seq_len=seq, pack_sequences=True, align_to_bos=True)
    assert len(ds) > 10
    for i in range(len(ds)):
        k, start = ds.locate(i)
        item = ds[i]
        ids = item["input_ids"]
        assert ids[0] == bos  # aligned: every sample starts at a document's BOS
        starts = v.split("train").shard_starts(k).astype(np.int64)
        inside = starts[(starts > start) & (starts <= start + seq)] - start
        expect_doc = np.zeros(seq, dtype=np.int64)
        for r in inside[inside < seq]:
            expect_doc[r:] += 1
        np.testing.assert_array_equal(item["doc_ids"], expect_doc)
        seg_start = np.concatenate(([0], inside[inside < seq]))
        pos = np.arange(seq) - seg_start[expect_doc]
        np.testing.assert_array_equal(item["position_ids"], pos)
        masked = np.flatnonzero(item["labels"] == -100)
        np.testing.assert_array_equal(masked, inside - 1)
        # Only EOS -> next BOS is masked; every masked input is an EOS, every document start a BOS.
        assert np.all(ids[masked] == eos)
        assert np.all(ids[inside[inside < seq]] == bos)


def test_refusals_happen_while_planning(tmp_path, tiny_parquet):
    def plan(**opts):
        cfg = BuildConfig(name="r", sources=(str(tiny_parquet),), **opts)
        return plan_build(cfg, data_root=tmp_path / "data", catalog=tmp_path / "catalog")

    with pytest.raises(ConfigError, match=r"--bos-token '<\|nope\|>': no token of 'cl100k_base' has this text"):
        plan(bos_token="<|nope|>")
    with pytest.raises(ConfigError, match=r"--eos-token 999999: id 999999 is not in the vocabulary of 'cl100k_base'"):
        plan(boundary="both", eos_token="999999")
    with pytest.raises(ConfigError, match=r"--eos-token 100270: id 100270 is not a token"):
        plan(boundary="eos", eos_token="100270")
    with pytest.raises(ConfigError, match=r"--eos-token .* places no EOS token; add --eos"):
        plan(eos_token=FIM_SUFFIX)
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.tok"))
    assert not (tmp_path / "catalog").exists()


def test_missing_defaults_name_the_flag(monkeypatch, tmp_path, tiny_parquet):
    from shardflow.pipeline.plan import resolve_boundaries
    from shardflow.tokenizers import TiktokenTokenizer

    tok = load_tokenizer("cl100k_base")
    monkeypatch.setattr(TiktokenTokenizer, "default_bos", property(lambda self: None))
    with pytest.raises(ConfigError, match=r"defines no BOS token; give one with --bos-token"):
        resolve_boundaries(BuildConfig(name="r", sources=("x",)), tok)

    def broken(self):
        raise KeyError("eos_token")

    monkeypatch.setattr(TiktokenTokenizer, "default_eos", property(broken))
    with pytest.raises(ConfigError, match=r"default EOS token cannot be found .*--eos-token"):
        resolve_boundaries(BuildConfig(name="r", sources=("x",), boundary="eos"), tok)
    # A token given by the user needs no default.
    got = resolve_boundaries(BuildConfig(name="r", sources=("x",), boundary="both", bos_token="100258", eos_token="<|fim_suffix|>"), tok)
    assert (got.bos, got.eos) == ((FIM_PREFIX, 100258), (FIM_SUFFIX, tok.token_id(FIM_SUFFIX)))


@pytest.mark.slow
def test_cli_both_and_refusal(tmp_path, tiny_parquet, capsys):
    from shardflow.cli.commands import main

    where = ["--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog")]
    cmd = ["build", str(tiny_parquet), "--name", "c", "--no-prefect", "--progress", "none", *where]
    assert main([*cmd, "--bos", "--eos", "--bos-token", "<|nope|>"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--bos-token '<|nope|>'" in err, err
    assert not (tmp_path / "catalog" / "c.yaml").exists()
    assert not list((tmp_path / "data").glob("c/v*"))
    assert main([*cmd, "--bos", "--eos", "--bos-token", FIM_PREFIX, "--eos-token", "100259"]) == 0
    m = read_manifest(tmp_path / "data" / "c" / "v1")
    assert m.boundary["placement"] == "both" and m.boundary["eos"]["id"] == 100259
    capsys.readouterr()
    assert main(["show", "c@v1", "--catalog", str(tmp_path / "catalog")]) == 0
    out = capsys.readouterr().out
    assert f"boundary BOS {FIM_PREFIX} = 100258, EOS " in out, out
    # --eos alone keeps its meaning: EOS after each document, <|endoftext|>.
    assert main([*cmd, "--eos", "--shard-tokens", "1000"]) == 0
    assert read_manifest(tmp_path / "data" / "c" / "v2").boundary == {
        "token": "<|endoftext|>", "token_id": 100257, "placement": "eos"
    }


@pytest.mark.slow
def test_incremental_reuse_compares_the_whole_boundary(tmp_path, corpus, monkeypatch):
    from support.builds import make_builder

    src, _ = corpus
    inc = tmp_path / "inc"
    inc.mkdir()
    shutil.copy(src / "a.parquet", inc / "a.parquet")
    make = make_builder(tmp_path / "root")
    opts = dict(boundary="both", bos_token=FIM_PREFIX, eos_token=FIM_SUFFIX, shard_tokens=20_000)
    make(inc, name="inc", **opts)
    shutil.copy(src / "b.parquet", inc / "b.parquet")
    v2 = make(inc, name="inc", **opts)
    m = read_manifest(v2.directory)
    assert m.extra["reuse"]["reused_inputs"] == ["a.parquet"]
    monkeypatch.setenv("SHARDFLOW_NO_REUSE", "1")
    full = make(inc, name="inc", root=tmp_path / "full", **opts)
    assert files_of(full.directory) == files_of(v2.directory)
    monkeypatch.delenv("SHARDFLOW_NO_REUSE")
    # Another placement (or other tokens) of the same inputs: nothing is reused.
    (inc / "b.parquet").unlink()
    other = make(inc, name="inc", boundary="both", shard_tokens=20_000)
    assert "reuse" not in read_manifest(other.directory).extra

    # A parent whose boundary section differs (here: edited EOS id) is not reused from.
    from shardflow.pipeline.incremental import plan_reuse
    from shardflow.pipeline.plan import resolve_boundaries, token_dtype
    from shardflow.catalog import Catalog
    from shardflow.sources import discover_inputs, fingerprint_inputs

    cfg = BuildConfig(name="inc", sources=(str(inc),), boundary="both", shard_tokens=20_000)
    tok = load_tokenizer("cl100k_base")
    inputs = fingerprint_inputs(discover_inputs(cfg.sources))
    cat = Catalog(tmp_path / "root" / "catalog")
    b = resolve_boundaries(cfg, tok)
    assert plan_reuse(cfg, inputs, tok, token_dtype(tok), cat, None, boundaries=b) is not None
    import dataclasses

    changed = dataclasses.replace(b, eos=("<|fim_suffix|>", tok.token_id(FIM_SUFFIX)))
    assert plan_reuse(cfg, inputs, tok, token_dtype(tok), cat, None, boundaries=changed) is None


def test_serve_takes_the_boundary_options(capsys):
    """A served deployment's parameters carry the placement and the tokens, as given; a contradiction is refused."""
    import json

    from shardflow.cli.commands import main

    serve = ["serve", "x/", "--name", "w", "--cron", "0 2 * * *", "--dry-run"]
    assert main([*serve, "--eos-token", FIM_SUFFIX]) == 2
    err = capsys.readouterr().err
    assert f"--eos-token {FIM_SUFFIX} is given but boundary='bos' places no EOS" in err and err.count("\n") == 1, err
    assert main([*serve, "--bos", "--eos", "--bos-token", "100258", "--eos-token", FIM_SUFFIX]) == 0
    config = json.loads(capsys.readouterr().out)["parameters"]["config"]
    assert (config["boundary"], config["bos_token"], config["eos_token"]) == ("both", "100258", FIM_SUFFIX)


def test_a_tokenizer_without_a_classic_boundary_records_the_tokens_it_was_given():
    """A bare tokenizer.json has no default boundary: the section names the token placed, whatever the placement."""
    from shardflow.pipeline.model import Boundaries

    eos = Boundaries(placement="eos", eos=("<|end_of_text|>", 128001))
    assert eos.manifest_section(None) == {
        "token": "<|end_of_text|>", "token_id": 128001, "placement": "eos", "eos": {"token": "<|end_of_text|>", "id": 128001}
    }
    # With the tokenizer's own classic boundary, the section keeps the shape it always had.
    classic = {"token": "<|end_of_text|>", "token_id": 128001, "placement": "eos"}
    assert eos.manifest_section(("<|end_of_text|>", 128001)) == classic
    assert Boundaries.from_section(eos.manifest_section(None)) == eos
