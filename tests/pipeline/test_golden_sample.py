"""Golden output of the bundled sample corpus: shard bytes and build keys pinned across refactors.

The digests were taken from the build code before it was split into stages
(commit b9be734), and taken again when issue 28 made shards of whole documents
(``BUILD_FORMAT_VERSION`` 2, manifest schema 3). A change that alters any shard
or index byte, or any build key (which would make every published version look
different to the next scheduled run), fails here. If a change of output is
intended, it must raise ``BUILD_FORMAT_VERSION`` and update these values in the
same commit. Each case is built with 1 and 2 workers: the same pins for both.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from support.builds import STATS_AND_CARD
from support.paths import SAMPLE

from shardflow.pipeline import build
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest

# (options, build key, digest of the files, number of files). Issue 28 (BUILD_FORMAT_VERSION 2) changed every
# key (the unit size is in it, and its default changed) and the bytes of "b" and "c": shards of whole documents,
# a placed split's cut per work unit ("b"'s train: one unit per row group, unit_bytes=1), a gathered one over the
# split's stream ("b"'s val; both splits of "c", a --val-count build). "a" is one shard either way, so its bytes
# did not change.
CASES = {
    "a": (
        {},
        "05495cdf5dc70b88d5f4eb25300ee8b7db7bd674ecc80e5794d6b224e31d7105",
        "672ec71977b4a43cde97a76ec41ca03dfb105b9ea4bf7d29901f95084da827d9",
        2,
    ),
    "b": (
        dict(format="npy", boundary="eos", val_fraction=0.2, shard_tokens=20000, unit_bytes=1),
        "6cbdfb6bbabfeed72f739880de3ef29d65cccc806ad3cd7750830161bb6b71c7",
        "ccf9a61020b1e78803f8d7a5cd456ea135025a61c4e14cdf938b0f0130a5ae15",
        20,
    ),
    "c": (
        dict(val_count=7, shard_tokens=15000, unit_bytes=1, format="nanogpt"),
        "15ca8da9fafa35012302ddb7d2d419f3129cc464efc00cd329f984e72d8bdf0a",
        "dccee954ee670874a764902c97bd8610325a4899d20124eee7dcff9e1a4dbd5f",
        24,
    ),
}

# Each shard's tokens, per split (a readable first failure when the layout moves). When they were pinned
# (issue 28) they were checked apart from the build: each split's documents, tokenized one by one and cut
# greedily at shard_tokens per work unit (placed) or over the whole split (gathered), give exactly these.
SHARD_TOKENS = {
    "a": {"train": [148378]},
    "b": {"train": [18804, 13097, 16593, 19959, 18126, 2159, 15429], "val": [18797, 19535, 5879]},
    "c": {"train": [14416, 13894, 8762, 12158, 7801, 13773, 14722, 14149, 13887, 7595], "val": [13288, 13933]},
}


def _digest(directory: Path) -> tuple[str, int]:
    files = sorted(
        (p.name, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in directory.rglob("*")  # the split directories' files too (manifest schema 2), by their own names
        if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] not in STATS_AND_CARD
    )
    return hashlib.sha256(json.dumps(files).encode()).hexdigest(), len(files)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_builds_are_byte_identical_to_the_pinned_digests(tmp_path, name, workers):
    options, key, digest, nfiles = CASES[name]
    result = build(
        BuildConfig(name=name, sources=(str(SAMPLE),), **options),
        data_root=tmp_path / "data",
        catalog=tmp_path / "cat",
        workers=workers,
    )
    directory = Path(result.manifest_path).parent
    manifest = read_manifest(directory)
    assert {split: [s.tokens for s in entry.shards] for split, entry in manifest.splits.items()} == SHARD_TOKENS[name]
    assert manifest.build_key == key
    assert _digest(directory) == (digest, nfiles)
