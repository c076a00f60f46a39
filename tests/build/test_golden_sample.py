"""Golden output of the bundled sample corpus: shard bytes and build keys pinned across refactors.

The digests were taken from the build code before it was split into stages
(commit b9be734). A change that alters any shard or index byte, or any build
key (which would make every published version look different to the next
scheduled run), fails here. If a change of output is intended, it must raise
``BUILD_FORMAT_VERSION`` and update these values in the same commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from core_support import SAMPLE, STATS_AND_CARD

from shardflow.build import build
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest

# (options, build key, digest of the files, number of files). The build keys changed once since b9be734, the
# bytes never: issue 28 put the unit size (unit_bytes) into the key.
CASES = {
    "a": (
        {},
        "f140139e8d7d1212a7b8eaaa54b42eacc01ecc7b27edcf26e03193fa604b748d",
        "672ec71977b4a43cde97a76ec41ca03dfb105b9ea4bf7d29901f95084da827d9",
        2,
    ),
    "b": (
        dict(format="npy", boundary="eos", val_fraction=0.2, shard_tokens=20000, unit_bytes=1),
        "a1b8a6f66502875f953577e85cfaf43fc0054e623fe5e0afb81ea415f71fa0af",
        "9de761871bb2bd335edeeb889014d4ac3f1ba7b764d10f4574502fc016ae74d6",
        18,
    ),
    "c": (
        dict(val_count=7, shard_tokens=15000, unit_bytes=1, format="nanogpt"),
        "a3a9baed9576b1faa7f1a2eeda1109b326cee64638eeb110b83bee091df807ab",
        "6b2c84bb5f87001afb1dbe43eade35bad6a8ddb372f475cc7a9d3fe023798b20",
        22,
    ),
}


def _digest(directory: Path) -> tuple[str, int]:
    files = sorted(
        (p.name, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in directory.rglob("*")  # the split directories' files too (manifest schema 2), by their own names
        if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] not in STATS_AND_CARD
    )
    return hashlib.sha256(json.dumps(files).encode()).hexdigest(), len(files)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_builds_are_byte_identical_to_the_pinned_digests(tmp_path, name):
    options, key, digest, nfiles = CASES[name]
    result = build(
        BuildConfig(name=name, sources=(str(SAMPLE),), **options),
        data_root=tmp_path / "data",
        catalog=tmp_path / "cat",
        workers=2,
    )
    directory = Path(result.manifest_path).parent
    assert read_manifest(directory).build_key == key
    assert _digest(directory) == (digest, nfiles)
