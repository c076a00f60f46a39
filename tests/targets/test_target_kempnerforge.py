"""``--target kempnerforge`` on the sample corpus: the printed TOML is a config KempnerForge's loader takes as printed.

The full checks (the real corpus, Llama 3, AutoTokenizer) are in the slow tier
(tests/targets/test_targets.py, test_trainer_configs.py). This one keeps the
target's settings in the fast tier: parsed as TOML, ``[data]`` globs exactly
the train shards, ``pack_sequences`` comes with a ``tokenizer_path`` whose
files name the manifest's EOS, and a version without ``hf_tokenizer/`` gets
``pack_sequences = false`` (KempnerForge refuses packing without a tokenizer).
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from support.paths import SAMPLE
from shardflow.targets import TARGETS


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory):
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.reader import open_version

    root = tmp_path_factory.mktemp("kempnerforge")
    config = BuildConfig(name="kf", sources=(str(SAMPLE),), target="kempnerforge", val_count=5, shard_tokens=40_000)
    result = build(config, data_root=root / "data", catalog=root / "catalog")
    return open_version(result.ref, catalog=root / "catalog")


def test_the_printed_data_table_packs_the_train_shards_with_a_tokenizer_naming_our_eos(version):
    m = version.manifest
    eos_text, eos_id = m.boundary_tokens.eos
    config = tomllib.loads(TARGETS["kempnerforge"].settings(m, version.directory))
    data = config["data"]
    assert config["model"]["vocab_size"] >= m.tokenized_info["vocab_size"]
    # MemoryMappedDataset: sorted glob of file_pattern in dataset_path, each np.load-ed.
    files = sorted(Path(data["dataset_path"]).glob(data["file_pattern"]))
    assert [p.relative_to(version.directory).as_posix() for p in files] == [s.file for s in m.splits["train"].shards]
    tokens = np.concatenate([np.load(p, mmap_mode="r") for p in files])
    assert tokens[-1] == eos_id and int((tokens == eos_id).sum()) == m.splits["train"].documents
    # train.py: pack_sequences needs tokenizer_path, and packing cuts at AutoTokenizer's eos_token_id.
    assert data["pack_sequences"] is True
    tokenizer_dir = Path(data["tokenizer_path"])
    assert json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["eos_token"] == eos_text
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(eos_text) == eos_id


def test_without_a_tokenizer_directory_packing_is_off_and_no_tokenizer_is_named(version, tmp_path):
    copy = Path(shutil.copytree(version.directory, tmp_path / "v1"))
    shutil.rmtree(copy / "hf_tokenizer")
    text = TARGETS["kempnerforge"].settings(version.manifest, copy)
    data = tomllib.loads(text)["data"]
    assert data["pack_sequences"] is False and "tokenizer_path" not in data
    assert data["dataset_path"] == str(copy / "train")
