"""``BuildConfig(target=...)`` through the Python API: an explicit option is told from an unset one.

The options a target decides (format, boundary, shard_tokens) default to None
("not given"), so ``boundary="bos"`` with a target that needs EOS is refused
as on the command line, even though ``bos`` is the value without a target.
"""

from __future__ import annotations

import pytest

from shardflow.config import BuildConfig
from shardflow.errors import ConfigError


def _config(**options) -> BuildConfig:
    return BuildConfig(name="x", sources=("a.parquet",), **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"target": "kempnerforge", "boundary": "bos"}, r"--target kempnerforge writes what KempnerForge \(MemoryMappedDataset\) reads: boundary eos or both, so --bos contradicts it"),
        ({"target": "olmo-core", "boundary": "bos"}, r"--target olmo-core writes what .* reads: boundary eos or both, so --bos contradicts it"),
        ({"target": "nemo", "format": "nanogpt", "boundary": "eos"}, r"--target nemo writes what .* reads: boundary bos, so --eos contradicts it"),
        ({"target": "modded-nanogpt", "format": "nanogpt"}, r"--target modded-nanogpt writes what .* reads: format nanogpt-legacy, so --format nanogpt contradicts it"),
        ({"target": "nanogpt", "shard_tokens": 100_000_000}, r"--target nanogpt writes one file per split .* so --shard-tokens does not apply"),
    ],
)
def test_an_explicit_value_that_contradicts_the_target_is_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        _config(**options)


def test_unset_options_take_the_target_or_the_defaults():
    assert (_config().format, _config().boundary, _config().shard_tokens) == ("nanogpt", "bos", 100_000_000)
    kf = _config(target="kempnerforge")
    assert (kf.format, kf.boundary, kf.shard_tokens) == ("npy", "eos", 100_000_000)
    assert _config(target="kempnerforge", boundary="both").boundary == "both"  # a refinement the stack reads
    ng = _config(target="nanogpt")
    assert (ng.format, ng.boundary, ng.shard_tokens) == ("bin", "eos", 2**63 - 1)
    # A made config holds no None: its dict (manifest, build key) is what it was before targets existed.
    d = _config().to_dict()
    assert (d["format"], d["boundary"], d["shard_tokens"]) == ("nanogpt", "bos", 100_000_000) and "_unset" not in d


def test_a_config_round_trips_and_replace_resolves_unset_options_again():
    kf = _config(target="kempnerforge")
    assert BuildConfig.from_dict(kf.to_dict()) == kf  # its resolved values agree with its target
    # The nanoGPT target's shard_tokens before int64 .bos.idx entries: a version's recorded config still opens.
    assert _config(target="nanogpt", shard_tokens=2**31 - 1).shard_tokens == 2**31 - 1
    moved = _config().replace(target="kempnerforge")  # format/boundary were never given: the target sets them
    assert (moved.format, moved.boundary) == ("npy", "eos")
    with pytest.raises(ConfigError, match=r"so --bos contradicts it"):
        _config(boundary="bos").replace(target="kempnerforge")  # given explicitly: checked
    assert _config(target="nanogpt").replace(target=None, format="npy", shard_tokens=1000).format == "npy"
