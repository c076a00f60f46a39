"""Options of the ``shardflow`` command line: the build and embed flags, and how they become a ``BuildConfig``.

``shardflow build`` and ``shardflow serve`` share the build flags (``serve``
builds one dataset on a schedule from the same flags); ``build --embed`` and
``shardflow embed`` share the embedding flags. Kept apart from ``cli.commands``,
which holds the commands.

The flags of ``BuildConfig`` and ``EmbedOptions`` fields are generated from the
dataclasses (``BUILD_FLAGS``, ``EMBED_FLAGS``: each field's flag name and help):
the default, the type and a ``Literal``'s choices are the field's own, written
once in ``shardflow.config``. A field with no flag is in ``UNFLAGGED_BUILD_FIELDS``
or ``UNFLAGGED_EMBED_FIELDS``, with the reason (``tests/test_cli_options.py``
checks that every field is one or the other).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

from shardflow.errors import ConfigError

# A scheme and "://": s3://, gs://, file://, https://... (a Windows drive letter has no "//").
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(spec: str) -> bool:
    return bool(_URL.match(spec))


def check_local_paths(args: argparse.Namespace) -> None:
    """Refuse a URL where only a local directory works: --data-root, --catalog and their environment variables.

    ``Path("s3://bucket/data")`` is the relative path ``s3:/bucket/data``: without
    this check a build would write a local directory named ``s3:``.
    """
    for option, env in (("--data-root", "SHARDFLOW_DATA_ROOT"), ("--catalog", "SHARDFLOW_CATALOG")):
        attr = option[2:].replace("-", "_")
        if not hasattr(args, attr):
            continue  # the command has no such option (and does not use the variable)
        value, given = getattr(args, attr), f"{option} {getattr(args, attr)}"
        if not value:
            value, given = os.environ.get(env), f"{env}={os.environ.get(env)}"
        if value and _URL.match(str(value)):
            raise ConfigError(
                f"{given}: a URL, but {option} must be a local directory for this command (build, serve and push "
                f"publish to a bucket, rm and gc remove from one, "
                f"ls, validate, show and diff read one; so does shardflow.runtime)"
                f"{'; unset ' + env + ' or give ' + option + ' DIR' if given.startswith(env) else ''}"
            )
        path = Path(value).expanduser().absolute() if value else None
        blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None) if path else None
        if blocked is not None:
            raise ConfigError(f"{given}: {blocked} is a file, not a directory; give {option} a directory")


def add_catalog_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", help="catalog directory (default: $SHARDFLOW_CATALOG or ./manifests)")


REF_HELP = "NAME@VERSION, NAME@latest, or a version directory / metadata.yaml"


def add_command(sub: Any, name: str, help: str, description: str | None = None, *, ref: str | None = REF_HELP,
                catalog: bool = True) -> argparse.ArgumentParser:
    """A subcommand of ``sub`` (what ``add_subparsers`` returned): its positional ``ref`` (unless None) and
    ``--catalog``; the caller adds the rest."""
    p = sub.add_parser(name, help=help, description=description)
    if ref is not None:
        p.add_argument("ref", help=ref)
    if catalog:
        add_catalog_option(p)
    return p


@dataclass(frozen=True, kw_only=True)
class Flag:
    """How one config field is given on the command line. Its default, type and (for a ``Literal``)
    choices are the field's own; a bool field that defaults to True is a ``--no-...`` switch."""

    help: str
    """The help text; ``{default}`` in it is replaced by the default, as the option counts it."""
    name: str | None = None
    """The option's name after ``--`` (and the embed prefix); None: the field's name with dashes."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    """The values allowed, where the annotation is not a ``Literal`` of them; None: the annotation's, if any."""
    mebibytes: bool = False
    """The option counts MiB (``--batch-mb``); the field holds bytes."""


def mib(text: str) -> int:
    """An option's value in MiB, as bytes (argparse names this function in its message on a bad value)."""
    return int(text) << 20


def count(text: str) -> int:
    """A non-negative integer option (argparse names this function in its message on a bad value)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def positive(text: str) -> int:
    """A positive integer option, such as ``--workers`` (argparse names this function in its message on a bad value)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build_flags() -> dict[str, Flag]:
    from shardflow.config import BACKENDS, TARGET_DEFAULTS
    from shardflow.formats import FORMATS
    from shardflow.targets import TARGETS

    return {
        "name": Flag(help="dataset name (lowercase letters, digits, '.', '_', '-')"),
        "text_column": Flag(help="column or JSON field holding the text (default: {default}); meta.text reaches a nested field"),
        "id_column": Flag(help="optional id column (checked to exist)"),
        "tokenizer": Flag(help="tiktoken encoding name, .tiktoken rank file, tokenizer.json (or its directory) or "
                          "SentencePiece .model (default: {default})"),
        "backend": Flag(choices=BACKENDS, help="tokenizer backend (default: {default}): auto, gigatoken, or the "
                        "family's reference (tiktoken, hf, sentencepiece)"),
        "format": Flag(help=f"shard format: {', '.join(FORMATS)} (megatron: Megatron-LM .bin + .idx); "
                       f"default: the target's, else {TARGET_DEFAULTS['format']}"),
        "shard_tokens": Flag(help=f"tokens per shard (default: the target's, else {TARGET_DEFAULTS['shard_tokens']:,})"),
        "target": Flag(choices=tuple(TARGETS), help="the trainer whose own reader loads the version as is: sets format, "
                       "boundary, dtype rule and file names, refuses what it cannot read, and prints its settings"),
        "bos_token": Flag(metavar="TEXT|ID", help="the BOS token's text or id (all digits: an id); default: the "
                          "tokenizer's own (<|endoftext|> for tiktoken encodings)"),
        "eos_token": Flag(metavar="TEXT|ID", help="the EOS token's text or id (all digits: an id); default: the "
                          "tokenizer's own (<|endoftext|> for tiktoken encodings)"),
        "val_fraction": Flag(help="hold out this fraction of documents as 'val'"),
        "val_count": Flag(help="hold out this many documents as 'val'"),
        "seed": Flag(help="seed of the validation split (default {default})"),
        "utf8_errors": Flag(help="invalid UTF-8 in binary text: replace it with U+FFFD, or skip the document "
                            "(default: {default})"),
        "on_bad_record": Flag(help="a JSON line that is not JSON or lacks the text field: fail, or skip and count it "
                              "(default: {default})"),
        "description": Flag(help="free text stored in the manifest"),
        "stats_column": Flag(metavar="COLUMN", help="also count tokens and documents per value of this column "
                             "(e.g. source) in stats.json and the card"),
        "stats": Flag(name="no-stats", help="collect no statistics: no stats.json, no 'stats' in the manifest, no card "
                      "(a version with other files: another build key)"),
        "card": Flag(name="no-card", help="draw no dataset card (card/); stats.json is still written"),
        "unit_bytes": Flag(name="unit-mb", mebibytes=True, help="MB of text per work unit: one tokenize job, whose "
                           "tokens become its own shard(s), so this sets the typical shard size (default {default})"),
        "batch_bytes": Flag(name="batch-mb", mebibytes=True, help="MB of text read and tokenized at once per worker "
                            "(bounds memory; default {default})"),
        "batch_rows": Flag(help="at most this many rows per batch (default {default})"),
        "embed": Flag(help="also compute one embedding per document (needs: pip install 'shardflow[embed]')"),
    }


UNFLAGGED_BUILD_FIELDS: Mapping[str, str] = types.MappingProxyType({
    "sources": "the commands' positional arguments (build: one or more; serve: beside --name and --cron)",
    "boundary": "set by the two switches --bos and --eos (both: BOS + ids + EOS); neither: the target's, else bos",
})
"""``BuildConfig`` fields with no flag of their own, and why."""


def _embed_flags() -> dict[str, Flag]:
    from shardflow.config import EMBED_CODECS

    return {
        "codec": Flag(choices=EMBED_CODECS, help="how embeddings are stored (default {default}: row-wise absmax, float32 scales)"),
        "long_docs": Flag(help="documents longer than the model's 256-token window: truncate, or chunk and mean-pool "
                          "(default: {default})"),
        "precision": Flag(help="model precision (default: {default}; bf16 autocast, cosine 0.99998 to fp32, is faster "
                          "on a GPU or a CPU with native bf16 but ~7x slower on an AVX2-only CPU: give fp32 there)"),
        "device": Flag(help="auto (GPU when present), cpu, cuda[:N] (default: {default})"),
        "min_mean_cosine": Flag(name="min-cosine", help="validation floor: mean cosine of the stored codes to float32 (default {default})"),
        "min_recall_at_10": Flag(name="min-recall", help="validation floor: recall@10 of nearest neighbours against float32 (default {default})"),
        "embed_dim": Flag(name="dim", metavar="K", help="keep K dimensions: a PCA fitted on the version's own embeddings, "
                          "before the codec (default: the model's full dimension)"),
        "pca_sample": Flag(metavar="ROWS", help="train documents (evenly spaced) the PCA is fitted on (default {default})"),
        "pca_min_mean_cosine": Flag(name="pca-min-cosine", help="validation floor with --{prefix}dim: mean cosine of the "
                                    "reconstruction to float32 (default {default})"),
        "pca_min_recall_at_10": Flag(name="pca-min-recall", help="validation floor with --{prefix}dim: recall@10 of "
                                     "neighbours in the reduced space (default {default})"),
    }


UNFLAGGED_EMBED_FIELDS: Mapping[str, str] = types.MappingProxyType({
    "model": "one model is supported (shardflow.embed.models.MODELS), so there is nothing to choose",
    "max_tokens": "the model's window; --embed-long-docs says what happens to a longer document",
    "batch_size": "speed only, never the stored embeddings: the Python API (EmbedOptions)",
    "docs_per_batch": "the stage's memory bound, never the stored embeddings: the Python API (EmbedOptions)",
    "quality_sample": "how many documents validation samples: the Python API (EmbedOptions)",
})
"""``EmbedOptions`` fields with no flag of their own, and why."""


def embed_dest(field: str) -> str:
    """The ``argparse`` destination of an ``EmbedOptions`` field (``embed_codec``; ``embed_dim`` as is)."""
    return field if field.startswith("embed_") else f"embed_{field}"


def _add_field(p: Any, cls: type, field: str, flag: Flag, *, prefix: str = "", dest: str | None = None,
               required: bool = False) -> None:
    """Add the option of ``cls``'s field ``field``: default, type and choices from the dataclass."""
    spec = {f.name: f for f in dataclasses.fields(cls)}[field]
    default = None if spec.default is dataclasses.MISSING else spec.default
    kind = _hints(cls)[field]
    args = typing.get_args(kind)
    if args and type(None) in args:  # "X | None": the option is X, its default may be None
        kind = next(a for a in args if a is not type(None))
    option = "--" + prefix + (flag.name or field.replace("_", "-"))
    kw: dict[str, Any] = {"dest": dest or field, "default": default}
    if kind is bool:
        if default is not True:
            raise TypeError(f"{cls.__name__}.{field}: a bool option is a --no-... switch, so its default must be True")
        p.add_argument(option, action="store_false", help=flag.help, **kw)
        return
    if dataclasses.is_dataclass(kind):  # a section of options (--embed: EmbedOptions from the embed flags)
        p.add_argument(option, action="store_const", const=True, help=flag.help, **kw)
        return
    if typing.get_origin(kind) is Literal:
        kw["choices"] = typing.get_args(kind)
    elif kind in (int, float):
        kw["type"] = mib if flag.mebibytes else kind
    if flag.choices is not None:
        kw["choices"] = flag.choices
    if flag.metavar or "choices" not in kw:  # named after the option, not the field (BATCH_MB, not BATCH_BYTES)
        kw["metavar"] = flag.metavar or option[2:].replace("-", "_").upper()
    if required:
        kw["required"] = True
    shown = default >> 20 if flag.mebibytes else default
    p.add_argument(option, help=flag.help.format(default=shown, prefix=prefix), **kw)


def add_embed_options(p: argparse.ArgumentParser, *, prefix: str) -> None:
    """Options of the embedding stage; ``prefix`` is "embed-" on build/serve and "" on ``embed``."""
    from shardflow.config import EmbedOptions

    group = p.add_argument_group("embedding options (EmbedOptions)")
    for field, flag in _embed_flags().items():
        _add_field(group, EmbedOptions, field, flag, prefix=prefix, dest=embed_dest(field))


def embed_options(args: argparse.Namespace, *, prefix: str = "") -> Any:
    """The ``EmbedOptions`` of the command line; ``prefix`` as ``add_embed_options`` had it (its errors name the flags)."""
    from shardflow.config import EmbedOptions

    with flags_named(_flag_names(_embed_flags(), prefix)):
        return EmbedOptions(**{field: getattr(args, embed_dest(field)) for field in _embed_flags()})


def embed_flag_names(prefix: str = "") -> dict[str, str]:
    """``{EmbedOptions field: "--option"}`` with ``prefix`` (``flags_named`` takes it)."""
    return _flag_names(_embed_flags(), prefix)


def _flag_names(flags: Mapping[str, Flag], prefix: str = "") -> dict[str, str]:
    """``{field: "--option"}``, as ``_add_field`` names them."""
    return {field: "--" + prefix + (flag.name or field.replace("_", "-")) for field, flag in flags.items()}


@contextlib.contextmanager
def flags_named(flags: Mapping[str, str]) -> Iterator[None]:
    """A ``ConfigError`` raised inside names the command line's flags (``--val-fraction 1.5``), not the config's fields
    (``val_fraction=1.5``): the library's messages name its fields, the command's name what the user typed."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(with_flags(str(exc), flags)) from None


def with_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with each field name of ``flags`` as its option: ``field=value`` and ``field (--flag)`` become
    ``--flag value`` and ``--flag``; a bare field name too where it has an underscore, so is no English word."""
    for field, option in sorted(flags.items(), key=lambda item: -len(item[0])):  # pca_min_mean_cosine first
        name = rf"(?<![\w-]){re.escape(field)}"
        message = re.sub(rf"{name} \({re.escape(option)}\)", option, message)
        message = re.sub(rf"{name}=", f"{option} ", message)
        if "_" in field:
            message = re.sub(rf"{name}(?![\w-])", option, message)
    return message


def add_build_options(b: argparse.ArgumentParser, *, name_required: bool) -> None:
    from shardflow.config import BuildConfig

    group = b.add_argument_group("build options (BuildConfig, recorded in the manifest)")
    for field, flag in _build_flags().items():
        if field == "bos_token":  # the placement's switches, before the tokens they place
            group.add_argument("--bos", action="store_true",
                               help="put a BOS token before each document (the default); with --eos too, each document is "
                               "BOS + ids + EOS (Llama 3 style)")
            group.add_argument("--eos", action="store_true",
                               help="put an EOS token after each document (alone: instead of the BOS, nanoGPT style)")
        _add_field(group, BuildConfig, field, flag, required=field == "name" and name_required)
    add_embed_options(b, prefix="embed-")
    run = b.add_argument_group("where and how the build runs")
    run.add_argument("--workers", type=int, default=2, help="work units tokenized at once (default 2)")
    run.add_argument("--data-root", help="where versions are written (default: $SHARDFLOW_DATA_ROOT or ./data); "
                     "s3://BUCKET/PREFIX publishes to a bucket, with --catalog s3://BUCKET/PREFIX too")
    add_catalog_option(run)
    run.add_argument("--scratch", help="for a build to a bucket: the local directory it is built in before the push "
                     "(default: $SHARDFLOW_SCRATCH or ~/.cache/shardflow/scratch; shared by the workers of --runner dask)")
    run.add_argument(
        "--runner", default="threads", choices=["threads", "dask"],
        help="where work units run: threads in this process (default) or a Dask cluster (needs --address)",
    )
    run.add_argument(
        "--address", default=None,
        help="Dask scheduler address for --runner dask, e.g. tcp://10.0.0.5:8786 (needs shardflow[dask] and "
        "a real Prefect server in PREFECT_API_URL)",
    )


def placement(args: argparse.Namespace) -> str:
    """``--bos`` (or neither): bos; ``--eos``: eos; both flags: both (BOS + ids + EOS)."""
    if args.bos and args.eos:
        return "both"
    return "eos" if args.eos else "bos"


def build_config(args: argparse.Namespace) -> Any:
    from shardflow.config import BuildConfig

    # Options given on the command line, as given: with --target, only those that contradict it are refused;
    # the others left unset (None, their fields' default) take the target's values.
    given = {
        "format": args.format,
        "boundary": placement(args) if (args.bos or args.eos) else None,
        "shard_tokens": args.shard_tokens,
    }
    if args.target is not None:
        from shardflow.targets import get_target

        get_target(args.target).check_given(given)
    options = {field: getattr(args, field) for field in _build_flags()}
    options["embed"] = embed_options(args, prefix="embed-") if args.embed else None
    with flags_named(_flag_names(_build_flags())):
        return BuildConfig(**options, boundary=given["boundary"], sources=tuple(args.sources))
