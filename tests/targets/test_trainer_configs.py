"""Every target's printed settings, as printed, taken by that stack's configuration reader (config_readers.py).

Each test builds the sample corpus with ``shardflow build --target`` (no
Prefect), cuts the settings block out of the real stdout and gives it to the
stack's config-level reader: the files it then opens must be the manifest's
shards in manifest order, and the boundary id it derives must be the
manifest's. The blocks printed before issue 25 are kept here, as they were
printed, and must be refused: KempnerForge's (packing without a
``tokenizer_path``) and Megatron's (no tokenizer flags, so the EOD id is not
ours; every shard prefix on the command line).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import config_readers as cr
import spec_readers as spec
from support.cli import run_main
from support.paths import SAMPLE

from shardflow.cli.commands import main
from shardflow.reader import open_version

pytest.importorskip("transformers", reason="the config readers load tokenizers with transformers.AutoTokenizer")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(target, tokenizer, *flags)``: ``(the printed settings block, the opened version)`` of SAMPLE built
    with ``shardflow build --target`` (no Prefect); one build per distinct call in this module."""
    cache: dict[tuple[str, ...], tuple[str, object]] = {}

    def build(target: str, tokenizer: str, *flags: str):
        key = (target, tokenizer, *flags)
        if key not in cache:
            root = tmp_path_factory.mktemp(target)
            cat = str(root / "catalog")
            rc, out, err = run_main("build", "--name", "s", str(SAMPLE), "--tokenizer", tokenizer, "--target", target,
                                    "--val-count", "6", "--data-root", str(root / "data"), "--catalog", cat, "--no-prefect", *flags)
            assert rc == 0, err
            cache[key] = (cr.printed_block(out), open_version("s@v1", catalog=cat, verify=True))
        return cache[key]

    return build


def _tokens(version, split: str) -> list[int]:
    shards = version.split(split)
    return np.asarray(shards.tokens(0, shards.num_tokens)).tolist()


@pytest.fixture
def tokenizers(gpt2_sized, llama3_dir):
    return {"gpt2-sized": str(gpt2_sized), "cl100k": "cl100k_base", "llama3": str(llama3_dir)}


# -- each stack's reader accepts what its target prints ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["cl100k", "llama3"])
def test_kempnerforge_packs_with_the_printed_tokenizer_and_our_eos(built, tokenizers, which):
    block, v = built("kempnerforge", tokenizers[which])
    data, eos = cr.kempnerforge_job(block)
    assert data["pack_sequences"] is True and eos == v.manifest.boundary_tokens.eos[1]
    files = cr.kempnerforge_files(data)
    assert [p.relative_to(v.directory).as_posix() for p in files] == [s.file for s in v.manifest.splits["train"].shards]
    assert np.concatenate([np.load(p, mmap_mode="r") for p in files]).tolist() == _tokens(v, "train")


@pytest.mark.slow
def test_the_tokenizer_kempnerforge_and_megatron_load_encodes_as_the_version_does(built):
    """cl100k rebuilt as a tokenizer.json: AutoTokenizer's ids are the version's reference ids, digits included."""
    from transformers import AutoTokenizer

    import pyarrow.parquet as pq

    block, v = built("kempnerforge", "cl100k_base")
    auto = AutoTokenizer.from_pretrained(cr.kempnerforge_job(block)[0]["tokenizer_path"])
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()[:20]
    texts += ["Between 1904 and 123456789 years", "  two  spaces\n\n\n tabs\t\there", "naïve café 😀 日本語"]
    for text in texts:
        assert auto(text, add_special_tokens=False)["input_ids"] == v.tokenizer.encode_ordinary(text), text[:80]
    assert (auto.eos_token, auto.eos_token_id) == ("<|endoftext|>", 100257)


@pytest.mark.parametrize("release", cr.MEGATRON_RELEASES)
@pytest.mark.parametrize("which", ["cl100k", pytest.param("llama3", marks=pytest.mark.slow)])
def test_megatron_flags_give_our_eod_and_every_prefix(built, tokenizers, which, release):
    block, v = built("megatron", tokenizers[which], "--shard-tokens", "40000")
    args = cr.megatron_args(block, release)
    assert cr.megatron_eod(args, release) == v.manifest.boundary_tokens.eos[1]
    train, valid, test = cr.megatron_blend_per_split(args)
    for split, prefixes in (("train", train), ("val", valid)):
        assert prefixes == [str(v.directory / s.file[: -len(".bin")]) for s in v.manifest.splits[split].shards]
        stream = [t for p in prefixes for doc in spec.megatron_documents(Path(p)) for t in doc]
        assert stream == _tokens(v, split)
    assert len(train) > 1 and test is None


@pytest.mark.slow
def test_megatron_core_reads_the_printed_files(built):
    """megatron-core itself (the ``trainers`` extra): its blend parser and its HuggingFace tokenizer's EOD."""
    pytest.importorskip("megatron.core", reason="pip install 'shardflow[trainers]' (megatron-core)")
    from megatron.core.datasets.utils import get_blend_from_list
    from megatron.core.tokenizers import MegatronTokenizer

    block, v = built("megatron", "cl100k_base", "--shard-tokens", "40000")
    args = cr.megatron_args(block, "core-0.16.1")
    train, _, _ = cr.megatron_blend_per_split(args)
    prefixes, weights = get_blend_from_list(train)
    assert list(prefixes) == train and weights is None
    tok = MegatronTokenizer.from_pretrained(tokenizer_path=args.tokenizer_model, metadata_path={"library": "huggingface"})
    assert tok.eod == v.manifest.boundary_tokens.eos[1] == 100257


def test_olmo_core_config_globs_the_shards_in_manifest_order(built):
    block, v = built("olmo-core", "cl100k_base", "--shard-tokens", "40000")
    config = cr.olmo_fsl_config(block)
    m = v.manifest
    assert config["tokenizer"]["eos_token_id"] == m.boundary_tokens.eos[1] and config["dtype"] == m.dtype
    paths = cr.olmo_paths(config)
    assert paths == [str(v.directory / s.file) for s in m.splits["train"].shards] and len(paths) > 1
    assert spec.olmo_tokens([Path(p) for p in paths], config["dtype"]).tolist() == _tokens(v, "train")


def test_nemo_yaml_builds_both_datasets(built):
    block, v = built("nemo", "cl100k_base")
    datasets = cr.nemo_datasets(block)
    for key, split in (("dataset", "train"), ("validation_dataset", "val")):
        args = datasets[key]
        assert args["bos_token"] == v.manifest.boundary_tokens.bos[1] and args["align_to_bos"] is True
        assert [Path(f).relative_to(v.directory).as_posix() for f in args["files"]] == [
            s.file for s in v.manifest.splits[split].shards
        ]


def test_nanogpt_config_finds_train_and_val_bin(built, tmp_path, gpt2_sized):
    block, v = built("nanogpt", str(gpt2_sized))
    config = cr.nanogpt_config(block, tmp_path / "nanogpt")
    for split in ("train", "val"):
        assert spec.nanogpt_tokens(config["data_dir"], split).tolist() == _tokens(v, split)


def test_modded_nanogpt_hyperparameters_glob_the_splits(built, gpt2_sized):
    block, v = built("modded-nanogpt", str(gpt2_sized))
    hp = cr.modded_hyperparameters(block)
    for field, split in (("train_files", "train"), ("val_files", "val")):
        files = spec.modded_files(hp[field])
        assert np.concatenate([spec.modded_shard(f) for f in files]).tolist() == _tokens(v, split)


def test_modded_nanogpt_loaders_take_the_printed_files(built, gpt2_sized):
    """train_gpt.py's loaders on the printed globs: its first train batch (which loads a second train file
    ahead), and one evaluation of the largest val_tokens the settings allow, which one more token breaks."""
    block, v = built("modded-nanogpt", str(gpt2_sized))
    hp = cr.modded_hyperparameters(block)
    assert len(v.manifest.splits["train"].shards) >= 2 and "train_files matches one file" not in block
    first = next(spec.modded_batches(hp["train_files"], 256, 128, align_to_bos=True))
    assert len(first) == 256 and first[0] == spec.MODDED_BOS
    most = int(re.search(r"val_tokens to a multiple .* of at most ([\d,]+)", block)[1].replace(",", ""))
    assert most == v.manifest.splits["val"].tokens - 2
    for val_tokens, fits in ((most, True), (most + 1, False)):
        val = spec.modded_batches(hp["val_files"], 1, 1, align_to_bos=False)
        with contextlib.nullcontext() if fits else pytest.raises(RuntimeError, match="generator raised StopIteration"):
            for _ in range(val_tokens):
                next(val)


def test_nanogpt_settings_flag_a_split_shorter_than_a_block(tmp_path, gpt2_sized, capsys):
    """get_batch draws from len(data) - block_size: a val.bin of 1024 tokens or fewer cannot give a batch."""
    corpus = tmp_path / "short.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}:" + " word" * 300}) + "\n" for i in range(8)))
    assert main(["build", "--name", "short", str(corpus), "--tokenizer", str(gpt2_sized), "--target", "nanogpt",
                 "--val-count", "1", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat"),
                 "--no-prefect"]) == 0
    block = cr.printed_block(capsys.readouterr().out)
    v = open_version("short@v1", catalog=str(tmp_path / "cat"))
    val, train = v.manifest.splits["val"].tokens, v.manifest.splits["train"].tokens
    assert val <= 1024 < train
    assert f"# WARNING: val.bin holds {val:,} tokens, and get_batch reads block_size + 1" in block
    assert "train.bin holds" not in block


# -- what was printed before: the readers refuse it ----------------------------------------------------------


def _old_kempnerforge_block(v, tokenizer_path: str | None) -> str:
    """The [data] table ``--target kempnerforge`` printed before issue 25 (tokenizer_path only as a comment
    for a named tiktoken encoding; else the copied file's path)."""
    eos = v.manifest.boundary_tokens.eos[1]
    lines = ["[data]", f'dataset_path = "{v.directory}/train"', 'file_pattern = "*.npy"',
             f"pack_sequences = true  # document-aware packing: documents end at the EOS id {eos}"]
    lines.append(f'tokenizer_path = "{tokenizer_path}"' if tokenizer_path else
                 "# tokenizer_path: cl100k_base (a tiktoken encoding; give the matching tokenizer)")
    return "\n".join(lines + ["[model]", f"vocab_size = {v.manifest.tokenized_info['vocab_size']}"])


@pytest.mark.slow
def test_the_old_kempnerforge_blocks_are_refused(built, llama3_dir):
    _, v = built("kempnerforge", "cl100k_base")
    with pytest.raises(ValueError, match=r"^data\.tokenizer_path is required when pack_sequences=True$"):
        cr.kempnerforge_job(_old_kempnerforge_block(v, None))
    _, lv = built("kempnerforge", str(llama3_dir))
    copied = lv.directory / lv.manifest.tokenized_info["tokenizer_file"]
    with pytest.raises(Exception, match=r"[Rr]epo id|Incorrect path|does not appear"):  # a file is no repo id
        cr.kempnerforge_job(_old_kempnerforge_block(lv, str(copied)))
    with pytest.raises(ValueError, match=r"AutoTokenizer loads no eos_token_id"):  # the version directory
        cr.kempnerforge_job(_old_kempnerforge_block(lv, str(lv.directory)))
    with pytest.raises(ValueError, match=r"Unknown config keys in DataConfig: \['tokenizer'\]"):
        cr.kempnerforge_job('[data]\ndataset_path = "/x"\ntokenizer = "y"\n')


def _old_megatron_flags(v) -> str:
    """The flags ``--target megatron`` printed before issue 25."""
    def prefixes(split):
        return " ".join(str(v.directory / s.file[: -len(".bin")]) for s in v.manifest.splits[split].shards)
    return "\n".join([f"--train-data-path {prefixes('train')}", f"--valid-data-path {prefixes('val')}",
                      f"--vocab-size {v.manifest.tokenized_info['vocab_size']}  # with --tokenizer-type NullTokenizer",
                      f"# EOD id {v.manifest.boundary_tokens.eos[1]} (the tokenizer's eod must be it)",
                      "--seq-length 4096  # your sequence length"])


@pytest.mark.parametrize("release", cr.MEGATRON_RELEASES)
def test_the_old_megatron_flags_do_not_give_our_eod(built, release):
    block, v = built("megatron", "cl100k_base", "--shard-tokens", "40000")
    eos = v.manifest.boundary_tokens.eos[1]
    old = _old_megatron_flags(v)
    with pytest.raises(NotImplementedError, match="None tokenizer is not implemented"):
        cr.megatron_eod(cr.megatron_args(old, release), release)
    as_its_comment_says = cr.megatron_args(old + "\n--tokenizer-type NullTokenizer", release)
    assert cr.megatron_eod(as_its_comment_says, release) in (100276, 100277) != eos  # vocab_size - 1 or vocab_size
    # Every shard was an argument: the new block names one file, however many shards there are.
    assert len(old.splitlines()[0].split()) == 1 + len(v.manifest.splits["train"].shards) > 2
    assert all(str(v.directory / "train") not in line for line in block.splitlines())


@pytest.mark.slow
def test_the_printed_block_does_not_grow_with_the_shard_count(built):
    """A version of tens of thousands of shards must not put them on a command line: the block's size is fixed."""
    sizes = {}
    for shard_tokens in ("200000", "40000"):
        for target in ("megatron", "olmo-core"):
            block, v = built(target, "cl100k_base", "--shard-tokens", shard_tokens)
            sizes.setdefault(target, []).append((len(v.manifest.splits["train"].shards), len(block.replace(str(v.directory), "D"))))
    for target, ((few, a), (many, b)) in sizes.items():
        assert many > few and a - b in range(-3, 4), (target, sizes)  # only the digits of a count may differ


# -- a tokenizer with no AutoTokenizer form here (SentencePiece .model) -----------------------------------


@pytest.mark.slow
def test_a_sentencepiece_version_prints_settings_that_need_no_tokenizer_directory(built, sp_model):
    block, v = built("kempnerforge", str(sp_model))
    data, eos = cr.kempnerforge_job(block)
    assert (data["pack_sequences"], eos, data["tokenizer_path"]) == (False, None, "")
    block, v = built("megatron", str(sp_model))
    eod = v.manifest.boundary_tokens.eos[1]
    assert cr.megatron_eod(cr.megatron_args(block, "d98e8a64"), "d98e8a64") == eod
    # A release without --null-tokenizer-eod-id refuses the flag rather than training with another EOD.
    with pytest.raises(ValueError, match=r"unrecognized arguments: --null-tokenizer-eod-id"):
        cr.megatron_args(block, "core-0.16.1")
