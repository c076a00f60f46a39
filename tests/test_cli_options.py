"""The build and embed flags are generated from ``BuildConfig`` and ``EmbedOptions``: each default is written once.

Every field of the two dataclasses is either a flag whose default is the
field's own, or listed with the reason it has none
(``UNFLAGGED_BUILD_FIELDS``, ``UNFLAGGED_EMBED_FIELDS``). Parsing the options
with none given makes the dataclasses' defaults; giving every flag changes
every flagged field. The parsers here are made from ``src/shardflow/cli/options.py``
alone, as ``shardflow build``, ``serve`` and ``embed`` make theirs.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from shardflow.config import BuildConfig, EmbedOptions
from shardflow.errors import ConfigError
from shardflow.cli.options import (
    UNFLAGGED_BUILD_FIELDS,
    UNFLAGGED_EMBED_FIELDS,
    add_build_options,
    add_embed_options,
    build_config,
    embed_options,
    embed_dest,
)

NAME = ("--name", "n")


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def _build_parser(*, name_required: bool = True) -> argparse.ArgumentParser:
    p = _Parser(prog="shardflow build")
    p.add_argument("sources", nargs="+")
    add_build_options(p, name_required=name_required)
    return p


def _embed_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shardflow embed")
    add_embed_options(p, prefix="")
    return p


def _config_of(*argv: str) -> BuildConfig:
    return build_config(_build_parser().parse_args(["corpus/", *NAME, *argv]))


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def test_every_build_field_is_a_flag_with_its_own_default_or_listed_with_why():
    parsed = vars(_build_parser(name_required=False).parse_args(["corpus/"]))
    flagged = []
    for name, field in _fields(BuildConfig).items():
        if name in UNFLAGGED_BUILD_FIELDS:
            assert len(UNFLAGGED_BUILD_FIELDS[name]) > 20, f"{name}: say why it has no flag"
            assert name not in parsed or name == "sources", f"{name} is listed as unflagged but has a flag"
            continue
        assert name in parsed, f"BuildConfig.{name} has no flag: add it to BUILD_FLAGS or UNFLAGGED_BUILD_FIELDS"
        default = None if field.default is dataclasses.MISSING else field.default  # name: required on build
        assert parsed[name] == default, f"--{name}: default {parsed[name]!r}, the field's {default!r}"
        flagged.append(name)
    assert set(UNFLAGGED_BUILD_FIELDS) <= set(_fields(BuildConfig)), "a listed field that BuildConfig no longer has"
    assert {"stats", "card", "batch_bytes", "embed", "format", "shard_tokens"} <= set(flagged)
    assert len(UNFLAGGED_BUILD_FIELDS) <= 4


@pytest.mark.parametrize("prefix", ["embed-", ""])
def test_every_embed_field_is_a_flag_with_its_own_default_or_listed_with_why(prefix):
    parser = _build_parser(name_required=False) if prefix else _embed_parser()
    parsed = vars(parser.parse_args(["corpus/"] if prefix else []))
    for name, field in _fields(EmbedOptions).items():
        if name in UNFLAGGED_EMBED_FIELDS:
            assert len(UNFLAGGED_EMBED_FIELDS[name]) > 20, f"{name}: say why it has no flag"
            assert embed_dest(name) not in parsed, f"{name} is listed as unflagged but has a flag"
            continue
        assert embed_dest(name) in parsed, f"EmbedOptions.{name} has no flag: add it to EMBED_FLAGS or UNFLAGGED_EMBED_FIELDS"
        assert parsed[embed_dest(name)] == field.default, f"{name}: default {parsed[embed_dest(name)]!r}, the field's {field.default!r}"
    assert set(UNFLAGGED_EMBED_FIELDS) <= set(_fields(EmbedOptions))
    assert len(UNFLAGGED_EMBED_FIELDS) <= 5


def test_no_options_make_the_dataclasses_defaults():
    assert _config_of() == BuildConfig(name="n", sources=("corpus/",))
    embedded = _config_of("--embed")
    assert embedded.embed == EmbedOptions() and embedded.replace(embed=None) == BuildConfig(name="n", sources=("corpus/",))
    assert embed_options(_embed_parser().parse_args([])) == EmbedOptions()


def test_every_build_flag_reaches_its_field():
    base = BuildConfig(name="n", sources=("corpus/",))
    given = _config_of(
        "--text-column", "body", "--id-column", "id", "--tokenizer", "gpt2", "--backend", "tiktoken",
        "--format", "npy", "--shard-tokens", "1000", "--bos", "--eos", "--bos-token", "5", "--eos-token", "7",
        "--val-fraction", "0.1",
        "--seed", "3", "--utf8-errors", "skip", "--on-bad-record", "skip", "--description", "d",
        "--stats-column", "source", "--no-card", "--unit-mb", "48", "--batch-mb", "7", "--batch-rows", "10",
        "--embed",
    )
    changed = {f for f in _fields(BuildConfig) if getattr(given, f) != getattr(base, f)}
    # val_count, target and stats each contradict one of these: given below, alone.
    assert changed == set(_fields(BuildConfig)) - set(UNFLAGGED_BUILD_FIELDS) - {"name", "val_count", "target", "stats"} | {"boundary"}
    assert (given.batch_bytes, given.boundary, given.card, given.stats) == (7 << 20, "both", False, True)
    assert given.unit_bytes == 48 << 20 and "unit_bytes" not in UNFLAGGED_BUILD_FIELDS
    assert _config_of("--eos").boundary == "eos" and _config_of("--bos").boundary == "bos"
    assert _config_of("--val-count", "5").val_count == 5
    assert _config_of("--target", "kempnerforge").target == "kempnerforge"
    no_stats = _config_of("--no-stats")
    assert (no_stats.stats, no_stats.card) == (False, False)  # no statistics, no card to draw from them


@pytest.mark.parametrize("prefix", ["embed-", ""])
def test_every_embed_flag_reaches_its_field(prefix):
    flags = [f"--{prefix}{a}" if a.startswith(("codec", "long", "prec", "dev", "min", "dim", "pca")) else a for a in (
        "codec", "float16", "long-docs", "chunk", "precision", "fp32", "device", "cpu", "min-cosine", "0.5",
        "min-recall", "0.5", "dim", "16", "pca-sample", "100", "pca-min-cosine", "0.5", "pca-min-recall", "0.5",
    )]
    if prefix:
        options = _config_of("--embed", *flags).embed
    else:
        options = embed_options(_embed_parser().parse_args(flags))
    changed = {f for f in _fields(EmbedOptions) if getattr(options, f) != getattr(EmbedOptions(), f)}
    assert changed == set(_fields(EmbedOptions)) - set(UNFLAGGED_EMBED_FIELDS)


def test_options_not_given_stay_unset_for_a_target():
    # format, boundary and shard_tokens left off the command line are the target's to set; given, they are checked.
    moved = _config_of().replace(target="kempnerforge")
    assert (moved.format, moved.boundary) == ("npy", "eos")
    with pytest.raises(ConfigError, match=r"--target kempnerforge .* so --bos contradicts it"):
        _config_of("--bos").replace(target="kempnerforge")
    with pytest.raises(ConfigError, match=r"--target kempnerforge .* so --bos contradicts it"):
        _config_of("--bos", "--target", "kempnerforge")


def test_bad_values_are_refused_by_the_parser_or_the_config():
    with pytest.raises(_Refused, match=r"argument --batch-mb: invalid mib value: 'lots'"):
        _config_of("--batch-mb", "lots")
    with pytest.raises(_Refused, match=r"argument --utf8-errors: invalid choice: 'ignore'"):
        _config_of("--utf8-errors", "ignore")
    with pytest.raises(_Refused, match=r"argument --embed-precision: invalid choice: 'fp8'"):
        _config_of("--embed", "--embed-precision", "fp8")
    with pytest.raises(ConfigError, match=r"unknown shard format 'zip'"):
        _config_of("--format", "zip")
    with pytest.raises(_Refused, match=r"the following arguments are required: --name"):
        _build_parser().parse_args(["corpus/"])
