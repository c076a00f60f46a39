"""Options of the ``shardflow`` command line: the build and embed flags, and how they become a ``BuildConfig``.

``shardflow build`` and ``shardflow serve`` share the build flags (``serve``
builds one dataset on a schedule from the same flags); ``build --embed`` and
``shardflow embed`` share the embedding flags. Kept apart from ``flows.cli``,
which holds the commands.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from shardflow.errors import ConfigError

# A scheme and "://": s3://, gs://, file://, https://... (a Windows drive letter has no "//").
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


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
                f"{given}: a URL, but {option} must be a local directory (output to object storage is not "
                f"supported yet){'; unset ' + env + ' or give ' + option + ' DIR' if given.startswith(env) else ''}"
            )


def _add_catalog(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", help="catalog directory (default: $SHARDFLOW_CATALOG or ./manifests)")


def _add_embed_options(p: argparse.ArgumentParser, *, prefix: str) -> None:
    """Options of the embedding stage; ``prefix`` is "embed-" on build/serve and "" on ``embed``."""
    from shardflow.config import EMBED_CODECS

    p.add_argument(f"--{prefix}codec", dest="embed_codec", default="int8", choices=EMBED_CODECS,
                   help="how embeddings are stored (default int8: row-wise absmax, float32 scales)")
    p.add_argument(f"--{prefix}long-docs", dest="embed_long_docs", default="truncate", choices=["truncate", "chunk"],
                   help="documents longer than the model's 256-token window: truncate (default) or chunk and mean-pool")
    p.add_argument(f"--{prefix}precision", dest="embed_precision", default="bf16", choices=["bf16", "fp32"],
                   help="model precision (bf16 autocast is ~1.8x faster on CPU, cosine 0.99998 to fp32)")
    p.add_argument(f"--{prefix}device", dest="embed_device", default="auto", help="auto (GPU when present), cpu, cuda[:N]")
    p.add_argument(f"--{prefix}min-cosine", dest="embed_min_cosine", type=float, default=0.99,
                   help="validation floor: mean cosine of the stored codes to float32 (default 0.99)")
    p.add_argument(f"--{prefix}min-recall", dest="embed_min_recall", type=float, default=0.90,
                   help="validation floor: recall@10 of nearest neighbours against float32 (default 0.90)")
    p.add_argument(f"--{prefix}dim", dest="embed_dim", type=int, default=None, metavar="K",
                   help="keep K dimensions: a PCA fitted on the version's own embeddings, before the codec "
                   "(default: the model's full dimension)")
    p.add_argument(f"--{prefix}pca-sample", dest="embed_pca_sample", type=int, default=10_000, metavar="ROWS",
                   help="train documents (evenly spaced) the PCA is fitted on (default 10000)")
    p.add_argument(f"--{prefix}pca-min-cosine", dest="embed_pca_min_cosine", type=float, default=0.90,
                   help=f"validation floor with --{prefix}dim: mean cosine of the reconstruction to float32 (default 0.90)")
    p.add_argument(f"--{prefix}pca-min-recall", dest="embed_pca_min_recall", type=float, default=0.70,
                   help=f"validation floor with --{prefix}dim: recall@10 of neighbours in the reduced space (default 0.70)")


def _embed_options(args: argparse.Namespace) -> Any:
    from shardflow.config import EmbedOptions

    return EmbedOptions(
        codec=args.embed_codec,
        long_docs=args.embed_long_docs,
        precision=args.embed_precision,
        device=args.embed_device,
        min_mean_cosine=args.embed_min_cosine,
        min_recall_at_10=args.embed_min_recall,
        embed_dim=args.embed_dim,
        pca_sample=args.embed_pca_sample,
        pca_min_mean_cosine=args.embed_pca_min_cosine,
        pca_min_recall_at_10=args.embed_pca_min_recall,
    )


def _add_build_options(b: argparse.ArgumentParser, *, name_required: bool) -> None:
    b.add_argument("--name", required=name_required, help="dataset name (lowercase letters, digits, '.', '_', '-')")
    b.add_argument("--text-column", default="text",
                   help="column or JSON field holding the text (default: text); meta.text reaches a nested field")
    b.add_argument("--id-column", default=None, help="optional id column (checked to exist)")
    from shardflow.config import BACKENDS

    b.add_argument("--tokenizer", default="cl100k_base",
                   help="tiktoken encoding name, .tiktoken rank file, tokenizer.json (or its directory) or SentencePiece .model")
    b.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="tokenizer backend: auto, gigatoken, or the family's reference (tiktoken, hf, sentencepiece)")
    b.add_argument("--format", default=None,
                   help="nanogpt (default), nanogpt-legacy, npy, bin or megatron (Megatron-LM .bin + .idx)")
    b.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard (default 10^8)")
    from shardflow.targets import TARGETS

    b.add_argument("--target", default=None, choices=list(TARGETS),
                   help="the trainer whose own reader loads the version as is: sets format, boundary, dtype rule "
                   "and file names, refuses what it cannot read, and prints its settings")
    b.add_argument("--bos", action="store_true",
                   help="put a BOS token before each document (the default); with --eos too, each document is "
                   "BOS + ids + EOS (Llama 3 style)")
    b.add_argument("--eos", action="store_true",
                   help="put an EOS token after each document (alone: instead of the BOS, nanoGPT style)")
    b.add_argument("--bos-token", default=None, metavar="TEXT|ID",
                   help="the BOS token's text or id (all digits: an id); default: the tokenizer's own "
                   "(<|endoftext|> for tiktoken encodings)")
    b.add_argument("--eos-token", default=None, metavar="TEXT|ID",
                   help="the EOS token's text or id (all digits: an id); default: the tokenizer's own "
                   "(<|endoftext|> for tiktoken encodings)")
    b.add_argument("--val-fraction", type=float, default=0.0, help="hold out this fraction of documents as 'val'")
    b.add_argument("--val-count", type=int, default=0, help="hold out this many documents as 'val'")
    b.add_argument("--seed", type=int, default=0, help="seed of the validation split (default 0)")
    b.add_argument("--utf8-errors", default="replace", choices=["replace", "skip"], help="invalid UTF-8 in binary text")
    b.add_argument("--on-bad-record", default="fail", choices=["fail", "skip"],
                   help="a JSON line that is not JSON or lacks the text field: fail (default) or skip and count it")
    b.add_argument("--description", default="", help="free text stored in the manifest")
    b.add_argument("--stats-column", default=None, metavar="COLUMN",
                   help="also count tokens and documents per value of this column (e.g. source) in stats.json and the card")
    b.add_argument("--workers", type=int, default=2, help="work units tokenized at once (default 2)")
    b.add_argument("--batch-mb", type=int, default=32, help="MB of text read and tokenized at once per worker (bounds memory)")
    b.add_argument("--batch-rows", type=int, default=65536, help="at most this many rows per batch")
    b.add_argument("--data-root", help="where versions are written (default: $SHARDFLOW_DATA_ROOT or ./data)")
    _add_catalog(b)
    b.add_argument("--embed", action="store_true",
                   help="also compute one embedding per document (needs: pip install 'shardflow[embed]')")
    _add_embed_options(b, prefix="embed-")
    b.add_argument(
        "--runner", default="threads", choices=["threads", "dask"],
        help="where work units run: threads in this process (default) or a Dask cluster (needs --address)",
    )
    b.add_argument(
        "--address", default=None,
        help="Dask scheduler address for --runner dask, e.g. tcp://10.0.0.5:8786 (needs shardflow[dask] and "
        "a real Prefect server in PREFECT_API_URL)",
    )


def _placement(args: argparse.Namespace) -> str:
    """``--bos`` (or neither): bos; ``--eos``: eos; both flags: both (BOS + ids + EOS)."""
    if args.bos and args.eos:
        return "both"
    return "eos" if args.eos else "bos"


def _config(args: argparse.Namespace) -> Any:
    from shardflow.config import BuildConfig

    # Options given on the command line, as given: with --target, only those that contradict it are refused;
    # the others left unset take the target's values.
    given = {
        "format": args.format,
        "boundary": _placement(args) if (args.bos or args.eos) else None,
        "shard_tokens": args.shard_tokens,
    }
    if args.target is not None:
        from shardflow.targets import get_target

        get_target(args.target).check_given(given)
    return BuildConfig(
        **{k: v for k, v in given.items() if v is not None},
        target=args.target,
        name=args.name,
        sources=tuple(args.sources),
        text_column=args.text_column,
        id_column=args.id_column,
        tokenizer=args.tokenizer,
        backend=args.backend,
        bos_token=args.bos_token,
        eos_token=args.eos_token,
        val_fraction=args.val_fraction,
        val_count=args.val_count,
        seed=args.seed,
        utf8_errors=args.utf8_errors,
        on_bad_record=args.on_bad_record,
        description=args.description,
        batch_bytes=args.batch_mb << 20,
        batch_rows=args.batch_rows,
        embed=_embed_options(args) if args.embed else None,
        stats_column=args.stats_column,
    )
