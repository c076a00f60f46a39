"""Every trainer target's output, read by a reader written from that stack's own rules (spec_readers.py).

The shared corpus (WikiText-2 articles and Tiny Shakespeare, ``real_corpus``)
is built for each target with the tokenizers its stack takes: a GPT-2-sized
vocabulary for the uint16 stacks (cl100k's first 50,256 ranks, so that
``<|endoftext|>`` is 50256), cl100k and Llama 3 for the others. Each reader
must see the manifest's tokens, token for token, and the documents of the
corpus as the reference tokenizer encodes them, with the boundary where the
stack expects it; a split directory's glob must hold only that split's shards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import spec_readers as spec

from shardflow.cli.commands import main
from shardflow.pipeline import build
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset
from shardflow.targets import TARGETS

@pytest.fixture
def tokenizers(request, gpt2_sized, llama3_dir):
    return {"gpt2-sized": str(gpt2_sized), "cl100k": "cl100k_base", "llama3": str(llama3_dir)}


def _build(tmp_path: Path, corpus: Path, target: str, tokenizer: str, **options):
    result = build(
        BuildConfig(name="shared", sources=(str(corpus),), tokenizer=tokenizer, target=target, val_count=20, **options),
        data_root=tmp_path / "data",
        catalog=tmp_path / "catalog",
    )
    return open_version(result.ref, catalog=tmp_path / "catalog", verify=True)


def _expected_documents(version, texts: list[str]) -> list[tuple[int, ...]]:
    """Every document of the corpus as the version's reference tokenizer encodes it, with its boundary tokens."""
    b = version.manifest.boundary_tokens
    tok = version.tokenizer
    head = [b.bos[1]] if b.bos else []
    tail = [b.eos[1]] if b.eos else []
    return sorted(tuple(head + tok.encode_ordinary(t) + tail) for t in texts if t)


def _manifest_tokens(version, split: str) -> list[int]:
    shards = version.split(split)
    return np.asarray(shards.tokens(0, shards.num_tokens)).tolist()


def _only_split_shards(version, split: str, pattern: str) -> None:
    """A glob over the split's directory sees that split's shards, in manifest order, and nothing else."""
    directory = version.directory / split
    found = sorted(p.relative_to(version.directory).as_posix() for p in directory.glob(pattern))
    assert found == [s.file for s in version.manifest.splits[split].shards]


# -- the six targets, each with its stack's reader ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2-sized"])
def test_modded_nanogpt(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "modded-nanogpt", tokenizers[which], shard_tokens=150_000)
    m = v.manifest
    assert m.format_name == "nanogpt-legacy" and m.dtype == "uint16" and m.extra["target"]["name"] == "modded-nanogpt"
    docs = []
    for split in ("train", "val"):
        _only_split_shards(v, split, "*.bin")
        files = spec.modded_files(str(v.directory / split / "*.bin"))
        tokens = np.concatenate([spec.modded_shard(f) for f in files])
        assert tokens.tolist() == _manifest_tokens(v, split)
        split_docs = spec.split_at_bos(tokens, spec.MODDED_BOS)
        assert len(split_docs) == m.splits[split].documents
        docs += split_docs
    assert len(m.splits["train"].shards) > 1
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2-sized"])
def test_nanogpt(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "nanogpt", tokenizers[which])
    m = v.manifest
    assert [s.file for s in m.splits["train"].shards] == ["train.bin"]
    assert [s.file for s in m.splits["val"].shards] == ["val.bin"]
    settings = TARGETS["nanogpt"].settings(m, v.directory)
    assert "dataset = 'shared'" in settings and f"ln -s {v.directory} data/shared" in settings
    docs = []
    for split in ("train", "val"):
        tokens = spec.nanogpt_tokens(v.directory, split)
        assert tokens.tolist() == _manifest_tokens(v, split)
        split_docs = spec.split_after_eos(np.asarray(tokens), m.boundary_tokens.eos[1])
        assert len(split_docs) == m.splits[split].documents
        docs += split_docs
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cl100k", "llama3"])
def test_nemo(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "nemo", tokenizers[which], shard_tokens=150_000)
    m = v.manifest
    assert m.format_name == "nanogpt" and m.boundary_tokens.placement == "bos"
    bos = m.boundary_tokens.bos[1]
    settings = TARGETS["nemo"].settings(m, v.directory)
    assert f'file_pattern: "{v.directory}/train/*.bin"' in settings and f"bos_token: {bos}" in settings
    assert "align_to_bos: true" in settings
    docs = []
    for split in ("train", "val"):
        _only_split_shards(v, split, "*.bin")
        parts = [spec.nemo_shard(f) for f in spec.modded_files(str(v.directory / split / "*.bin"))]
        tokens = np.concatenate([t for t, _ in parts])
        assert tokens.tolist() == _manifest_tokens(v, split)
        for t, positions in parts:  # the index lists exactly the BOS tokens of its shard
            assert positions.tolist() == np.flatnonzero(t == bos).tolist()
        docs += spec.split_at_bos(tokens, bos)
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)
    # NeMo's BOS-aligned samples are the runtime's with align_rule="nemo".
    seq_len = 256
    train = spec.modded_files(str(v.directory / "train" / "*.bin"))
    nemo = sum(len(spec.nemo_sample_starts(p, len(t), seq_len)) for t, p in map(spec.nemo_shard, train))
    ours = TokenDataset(str(v.directory), seq_len=seq_len, align_to_bos=True, align_rule="nemo")
    assert len(ours) == nemo
    assert len(TokenDataset(str(v.directory), seq_len=seq_len, align_to_bos=True)) >= nemo


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cl100k", "llama3"])
def test_kempnerforge(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "kempnerforge", tokenizers[which], shard_tokens=150_000)
    m = v.manifest
    assert m.format_name == "npy" and m.boundary_tokens.placement == "eos"
    settings = TARGETS["kempnerforge"].settings(m, v.directory)
    assert f'dataset_path = "{v.directory}/train"' in settings and 'file_pattern = "*.npy"' in settings
    assert f"the EOS id {m.boundary_tokens.eos[1]}" in settings and f"vocab_size = {m.tokenized_info['vocab_size']}" in settings
    docs = []
    for split in ("train", "val"):
        _only_split_shards(v, split, "*.npy")
        tokens = spec.kempner_tokens(v.directory / split)
        assert tokens.dtype == np.dtype(m.dtype) and tokens.tolist() == _manifest_tokens(v, split)
        docs += spec.split_after_eos(tokens, m.boundary_tokens.eos[1])
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cl100k", "llama3"])
def test_olmo_core(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "olmo-core", tokenizers[which], shard_tokens=150_000)
    m = v.manifest
    assert m.format_name == "bin" and m.boundary_tokens.placement == "eos"
    settings = TARGETS["olmo-core"].settings(m, v.directory)
    assert f"dtype=NumpyDatasetDType.{m.dtype}" in settings and f"eos_token_id={m.boundary_tokens.eos[1]}" in settings
    assert f'paths=["{v.directory}/train/*.bin"],' in settings and "expand_glob=True," in settings
    docs = []
    for split in ("train", "val"):
        paths = [v.directory / s.file for s in m.splits[split].shards]
        tokens = spec.olmo_tokens(paths, m.dtype)
        assert tokens.tolist() == _manifest_tokens(v, split)
        docs += spec.split_after_eos(tokens, m.boundary_tokens.eos[1])
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cl100k", "llama3"])
def test_megatron(tmp_path, real_corpus, real_texts, tokenizers, which):
    v = _build(tmp_path, real_corpus, "megatron", tokenizers[which], shard_tokens=150_000)
    m = v.manifest
    assert m.format_name == "megatron" and m.boundary_tokens.placement == "eos"
    eos = m.boundary_tokens.eos[1]
    settings = TARGETS["megatron"].settings(m, v.directory)
    assert f"--per-split-data-args-path {v.directory}/megatron_data_args.json" in settings
    assert f"--tokenizer-model {v.directory}/hf_tokenizer  # its eos_token is Megatron's EOD: id {eos}" in settings
    docs = []
    for split in ("train", "val"):
        _only_split_shards(v, split, "*.bin")
        stream: list[int] = []
        for shard in m.splits[split].shards:
            pieces = spec.megatron_documents(v.directory / shard.file[: -len(".bin")])
            # One sequence per document: every piece but a shard's first (a continued document) ends with the EOS.
            assert all(p[-1] == eos for p in pieces[:-1] if p)
            stream += sum(pieces, [])
        assert stream == _manifest_tokens(v, split)
        docs += spec.split_after_eos(np.asarray(stream), eos)
    assert sorted(map(tuple, docs)) == _expected_documents(v, real_texts)


# -- what a stack cannot read: one message, nothing published ---------------------------------------------


def _nothing_published(tmp_path: Path) -> None:
    assert Catalog(tmp_path / "catalog").versions("shared") == []
    data = tmp_path / "data" / "shared"
    assert not data.exists() or not [p for p in data.iterdir() if p.name.startswith("v")]


@pytest.mark.parametrize(
    "target,which,message",
    [
        ("modded-nanogpt", "cl100k", r"--target modded-nanogpt: modded-nanogpt \(and llm\.c\) reads uint16 tokens only, but cl100k_base has 100277 ids and needs uint32"),
        ("nanogpt", "cl100k", r"--target nanogpt: nanoGPT \(train\.py\) reads uint16 tokens only"),
        ("nanogpt", "llama3", r"--target nanogpt: nanoGPT \(train\.py\) reads uint16 tokens only"),
    ],
)
def test_a_vocabulary_the_stack_cannot_read_is_refused(tmp_path, real_corpus, tokenizers, target, which, message):
    with pytest.raises(ConfigError, match=message):
        _build(tmp_path, real_corpus, target, tokenizers[which])
    _nothing_published(tmp_path)


def test_modded_nanogpt_refuses_another_boundary_id(tmp_path, real_corpus, small_vocab):
    with pytest.raises(ConfigError, match=r"hard-codes the document boundary id 50256, but the boundary token of .*small5000\.tiktoken is 5000"):
        _build(tmp_path, real_corpus, "modded-nanogpt", str(small_vocab))
    _nothing_published(tmp_path)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--target", "modded-nanogpt", "--format", "nanogpt"], r"--target modded-nanogpt writes what modded-nanogpt \(and llm\.c\) reads: format nanogpt-legacy, so --format nanogpt contradicts it"),
        (["--target", "kempnerforge", "--bos"], r"boundary eos or both, so --bos contradicts it"),
        (["--target", "nanogpt", "--shard-tokens", "1000"], r"--target nanogpt writes one file per split .* so --shard-tokens does not apply"),
        (["--target", "nemo", "--eos"], r"NeMo Automodel \(NanogptDataset\) reads: boundary bos, so --eos contradicts it"),
        (["--target", "megatron", "--bos"], r"boundary eos or both, so --bos contradicts it"),
        (["--target", "olmo-core", "--format", "npy"], r"OLMo-core \(numpy datasets\) reads: format bin, so --format npy contradicts it"),
        (["--target", "nanogpt", "--format", "npy"], r"nanoGPT \(train\.py\) reads: format bin, so --format npy contradicts it"),
    ],
)
def test_contradicting_options_are_refused_on_the_command_line(tmp_path, real_corpus, capsys, flags, message):
    import re

    rc = main(["build", "--name", "shared", str(real_corpus), "--data-root", str(tmp_path / "data"),
               "--catalog", str(tmp_path / "catalog"), "--no-prefect", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err) and "Traceback" not in err, err
    _nothing_published(tmp_path)


@pytest.mark.slow
def test_explicit_options_may_refine_a_target(tmp_path, real_corpus, tokenizers):
    v = _build(tmp_path, real_corpus, "megatron", tokenizers["cl100k"], boundary="both", shard_tokens=400_000)
    m = v.manifest
    assert m.boundary_tokens.placement == "both" and m.format_name == "megatron" and m.config["shard_tokens"] == 400_000


# -- printed settings, and the layout of split directories ---------------------------------------------------


@pytest.mark.slow
def test_build_prints_the_settings_and_validate_for_checks_the_target(tmp_path, real_corpus, gpt2_sized, capsys):
    cat = str(tmp_path / "catalog")
    rc = main(["build", "--name", "shared", str(real_corpus), "--tokenizer", str(gpt2_sized), "--val-count", "20",
               "--target", "modded-nanogpt", "--data-root", str(tmp_path / "data"), "--catalog", cat, "--no-prefect"])
    out = capsys.readouterr().out
    directory = tmp_path / "data" / "shared" / "v1"
    assert rc == 0
    assert f'train_files = "{directory}/train/*.bin"' in out and f'val_files = "{directory}/val/*.bin"' in out
    assert "WARNING: the val split holds" in out and "one evaluation of the default val_tokens 10,485,760 reads 10,485,762" in out
    assert "tokens: uint16, vocab_size 50257, BOS id 50256" in out
    # The settings come first: the last line stays the manifest's path, as for any build.
    assert out.splitlines()[-2:] == ["published shared@v1", str(directory / "metadata.yaml")]
    assert main(["validate", "shared@v1", "--catalog", cat, "--for", "modded-nanogpt"]) == 0
    assert 'train_files = "' in capsys.readouterr().out
    assert main(["validate", "shared@v1", "--catalog", cat, "--for", "olmo-core"]) == 2
    out, err = capsys.readouterr()
    assert "OK shared@v1" not in out
    assert "OLMo-core (numpy datasets) cannot load shared@v1 as it is: its format is nanogpt-legacy" in err
    assert "Rebuild it with --target olmo-core" in err and "Traceback" not in err


@pytest.mark.slow
def test_embedding_and_val_files_never_appear_in_a_train_directory_glob(tmp_path):
    from support.paths import SAMPLE

    from shardflow.config import EmbedOptions

    # fp32, not the default bf16: bf16 autocast is ~6x slower on a CPU without native bf16 (AVX2 only).
    result = build(
        BuildConfig(name="emb", sources=(str(SAMPLE),), target="kempnerforge", val_count=12, shard_tokens=40_000,
                    embed=EmbedOptions(codec="int8", precision="fp32")),
        data_root=tmp_path / "data",
        catalog=tmp_path / "catalog",
    )
    v = open_version(result.ref, catalog=tmp_path / "catalog", verify=True)
    train = spec.kempner_files(v.directory / "train")
    assert [p.relative_to(v.directory).as_posix() for p in train] == [s.file for s in v.manifest.splits["train"].shards]
    assert all(".emb." not in p.name and "_val_" not in p.name for p in train)
    section = v.manifest.splits["train"].extra["embeddings"]
    files = [part["file"] for part in section["parts"]]
    assert files and all(f.startswith("embeddings/") and (v.directory / f).is_file() for f in files)


def test_serve_takes_a_target(tmp_path, real_corpus, capsys):
    import json

    serve = ["serve", str(real_corpus), "--name", "shared", "--cron", "0 2 * * *", "--dry-run"]
    assert main([*serve, "--target", "olmo-core"]) == 0
    config = json.loads(capsys.readouterr().out)["parameters"]["config"]
    assert (config["target"], config["format"], config["boundary"]) == ("olmo-core", "bin", "eos")
    # An option that contradicts the target is refused before any deployment is made.
    assert main([*serve, "--target", "modded-nanogpt", "--format", "nanogpt"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "format nanogpt-legacy, so --format nanogpt contradicts it" in err and err.count("\n") == 1


def test_one_file_per_split_refuses_a_split_over_its_format_limit_at_the_layout():
    # nanoGPT's bin holds any split (tests/targets/test_large_split.py builds one past the int32 index limit);
    # the layout's check remains for a one-file format with an int32 token count in its header.
    # A config recorded before int64 entries (shard_tokens 2**31 - 1) is told to drop shard_tokens.
    TARGETS["nanogpt"].check_shard_counts({"train": 1, "val": 1}, shard_tokens=2**63 - 1, fmt="bin")
    TARGETS["olmo-core"].check_shard_counts({"train": 7}, shard_tokens=1000, fmt="bin")
    with pytest.raises(ConfigError, match=r"--target nanogpt writes one train file .* split 'train' holds more than shard_tokens=2,147,483,647 tokens; rebuild without shard_tokens \(one bin file holds up to 9,223,372,036,854,775,807 tokens\)"):
        TARGETS["nanogpt"].check_shard_counts({"train": 2, "val": 1}, shard_tokens=2**31 - 1, fmt="bin")
    with pytest.raises(ConfigError, match=r"split 'val' holds more than shard_tokens=2,147,483,647 tokens; use --target olmo-core or kempnerforge"):
        TARGETS["nanogpt"].check_shard_counts({"val": 2}, shard_tokens=2**31 - 1, fmt="nanogpt-legacy")
