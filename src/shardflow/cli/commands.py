"""The ``shardflow`` command line: the parser, the commands' table, and one message per error.

A user error (bad input, bad option, failed validation) is one message on
standard error and exit status 2, never a traceback. Output cut short by its
reader (``| head``) ends quietly with status 141 (``terminal.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Sequence

from shardflow.errors import ShardflowError

from .build import cmd_build, cmd_embed, cmd_serve
from .card import add_card_parser, cmd_card
from .options import add_build_options, add_command, add_embed_options, check_local_paths, count, is_url, positive
from .terminal import PIPELINE_HINT, PIPELINE_MODULES, quiet_broken_pipe, stdout_closed
from .lifecycle import add_lifecycle_parsers, cmd_gc, cmd_push, cmd_rm
from .versions import BUCKET_COMMANDS, cmd_diff, cmd_ls, cmd_show, cmd_validate

__all__ = ["main", "run", "build_parser"]

DESCRIPTION = ("shardflow: text corpora to tokenized, validated, versioned token shards. Build a version, read it, "
               "and manage the versions of a catalog.")
EXIT_USER_ERROR = 2
EXIT_IO_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    from shardflow import __version__

    parser = argparse.ArgumentParser(prog="shardflow", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"shardflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="tokenize sources into a new published version")
    b.add_argument(
        "sources", nargs="+",
        help="Parquet/Arrow/JSON Lines files, directories, globs, save_to_disk datasets, or URLs (file://, s3://...)",
    )
    add_build_options(b, name_required=True)
    b.add_argument("--no-prefect", action="store_true", help="run the steps in this process, without Prefect")
    b.add_argument(
        "--progress", default="auto", choices=["auto", "bar", "plain", "none"],
        help="progress on stderr: a bar on a terminal, plain lines when piped or under CI (default auto)",
    )

    sv = sub.add_parser(
        "serve",
        help="serve one dataset's build as a Prefect deployment, on a cron schedule",
        description="Register a build_dataset deployment of one dataset, with its cron schedule and build options, "
        "and run its flow runs until interrupted. Start a run by hand with: prefect deployment run "
        "build-dataset/DEPLOYMENT. Several datasets: declare them in prefect.yaml (docs/OPERATIONS.md).",
    )
    sv.add_argument("sources", nargs="+", help="sources of the dataset, as for build (local paths made absolute)")
    add_build_options(sv, name_required=True)
    sv.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *' (02:00 daily); without it, runs start by hand only")
    sv.add_argument("--timezone", default=None, help="timezone of --cron (IANA name, default UTC)")
    sv.add_argument("--deployment", help="deployment name (default: the dataset name)")
    sv.add_argument("--limit", type=int, default=None, help="at most this many flow runs at once")
    sv.add_argument("--dry-run", action="store_true", help="print the deployment as JSON and exit")

    v = add_command(sub, "validate", "check a published version against its manifest")
    v.add_argument("--no-checksums", action="store_true", help="skip SHA-256 checks (faster)")
    v.add_argument("--workers", type=positive, default=None, metavar="N",
                   help="files checked at once (default: up to 4 locally, the cores'; 8 objects at once from a bucket)")
    v.add_argument("--standalone", action="store_true",
                   help="a version directory that no catalog lists: check its files against its own manifest only "
                   "(without it, such a directory fails)")
    from shardflow.targets import TARGETS

    v.add_argument("--for", dest="for_target", default=None, choices=list(TARGETS), metavar="TARGET",
                   help=f"also check that TARGET's own reader loads the version, and print its settings ({', '.join(TARGETS)})")

    add_command(sub, "ls", "list datasets, or the versions of one dataset", ref=None).add_argument("name", nargs="?")

    e = add_command(sub, "embed", "add embeddings to a published version (a new version; token shards hard-linked)",
                    "Compute one embedding per document of every split of REF and publish them as a new version "
                    "whose parent is REF. The token shards are hard-linked from REF, not copied.")
    add_embed_options(e, prefix="")
    e.add_argument("--data-root", help="where the new version is written (default: beside REF)")

    s = add_command(sub, "show", "print a version's manifest summary")
    s.add_argument("--split", default=None, help="split to sample from (default: train)")
    s.add_argument("--samples", type=count, default=2, help="decoded samples to print")
    s.add_argument("--card", action="store_true", help="print the path of the version's dataset card (card/README.md)")

    d = add_command(sub, "diff", "compare two versions: inputs, per-split tokens and documents, configuration", ref=None)
    d.add_argument("ref_a")
    d.add_argument("ref_b")
    d.add_argument("--all", action="store_true", help="list unchanged inputs too")
    add_card_parser(sub)
    add_lifecycle_parsers(sub)
    return parser


COMMANDS = {
    "build": cmd_build,
    "embed": cmd_embed,
    "validate": cmd_validate,
    "ls": cmd_ls,
    "show": cmd_show,
    "diff": cmd_diff,
    "card": cmd_card,
    "serve": cmd_serve,
    "rm": cmd_rm,
    "gc": cmd_gc,
    "push": cmd_push,
}


def _places(args: argparse.Namespace) -> dict[str, Any]:
    """The command's directories by option, for a full disk's message (only those the command has)."""
    from shardflow.catalog import default_catalog, default_data_root

    def place(value: str | None, env: str, local: Any) -> Any:
        given = value or os.environ.get(env)  # a URL in the environment too: default_* would refuse it here
        return given if is_url(given or "") else local(value)

    places: dict[str, Any] = {}
    if hasattr(args, "data_root"):
        places["--data-root"] = place(args.data_root, "SHARDFLOW_DATA_ROOT", default_data_root)
    if hasattr(args, "catalog"):
        places["--catalog"] = place(args.catalog, "SHARDFLOW_CATALOG", default_catalog)
    if hasattr(args, "scratch") and (args.scratch or places.get("--data-root") is not None
                                     and is_url(str(places["--data-root"]))):
        from shardflow.bucket.build import default_scratch

        places["--scratch"] = default_scratch(args.scratch)
    return places


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shardflow`` command; returns the exit status."""
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names (parsed by ``build_parser``), with one message per error; its exit status."""
    try:
        # build and serve (a scratch), rm and gc: their data root and catalog may be on a bucket, checked there
        if not hasattr(args, "scratch") and args.command not in BUCKET_COMMANDS:
            check_local_paths(args)
        return COMMANDS[args.command](args)
    except ShardflowError as exc:
        print(f"shardflow: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in PIPELINE_MODULES:
            raise  # a bug (or a damaged install): keep its traceback
        embeds = args.command == "embed" or getattr(args, "embed", False)
        hint = PIPELINE_HINT.replace("[pipeline]", "[pipeline,embed]") if embeds else PIPELINE_HINT
        print(f"shardflow: error: shardflow {args.command} needs {exc.name}, which is not installed here; {hint}",
              file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and stdout_closed():
            return quiet_broken_pipe()  # `| head`: not an error (another pipe's is one, below)
        # A full disk, a read-only or flaky mount: one line, no traceback. Nothing partial is published.
        from shardflow.errors import describe_os_error

        print(f"shardflow: error: {describe_os_error(exc, places=_places(args))}", file=sys.stderr)
        return EXIT_IO_ERROR
    except KeyboardInterrupt:
        print("shardflow: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # An object store's failures are not OSErrors: no credentials, its endpoint down or gone mid-build.
        from shardflow.errors import describe_storage_error, network_unreachable

        message = describe_storage_error(exc)
        if message is None:
            raise  # a bug: keep its traceback
        print(f"shardflow: error: {message}", file=sys.stderr)
        return EXIT_IO_ERROR if network_unreachable(exc) else EXIT_USER_ERROR


ENDS_AT_ONCE = ("build",)
"""Commands after which the console script ends without the interpreter's teardown (and any that loaded Prefect)."""


def run() -> None:
    """The ``shardflow`` console script: :func:`main`, and after a build or a flow, an exit without the interpreter's teardown.

    Tearing down an interpreter that loaded Prefect is slow (its threads
    stopped, its modules freed one by one; docs/PERFORMANCE.md), and one that
    ran a build pays 0.1 s for it (the tokenizer's libraries, Arrow, awkward):
    a tenth of an incremental build's command. A build's own clean-up ran
    inside the command (its locks released, its files committed; it holds
    no reader's pin, which other commands release at exit); Prefect's queued
    logs and events were sent when the flow ended (``flows.launch``). The
    process then ends at once (``os._exit``), its output flushed.
    """
    args = build_parser().parse_args()
    code = run_command(args)
    if "prefect" in sys.modules or args.command in ENDS_AT_ONCE:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)
