"""The ``shardflow`` command line: build, embed, serve, card, targets; validate, ls, show, diff, rm, gc, push (``catalog_cli.py``).

``build`` runs the ``build_dataset`` Prefect flow (on Prefect's temporary local
server unless ``PREFECT_API_URL`` points at a real one), prints the published
reference, and prints the absolute path of the version's ``metadata.yaml`` as
the last line of standard output. ``--no-prefect`` runs the same core steps in
this process without Prefect. ``--runner dask --address tcp://HOST:PORT`` runs
the work units on an existing Dask cluster. Progress goes to standard error: a
bar on a terminal, plain lines when piped or under CI.

``serve`` registers a scheduled deployment of one dataset's build and runs its
flow runs (several datasets: ``prefect.yaml``, docs/OPERATIONS.md).

A user error (bad input, bad option, failed validation) is one message on
standard error and exit status 2, never a traceback. A rebuild that finds the identical
version prints ``nothing new: NAME@vN is identical`` instead of ``published``.
Output cut short by its reader (``| head``) ends quietly with status 141; what
else is kept off the terminal is in ``flows/terminal.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Sequence

from shardflow.errors import ShardflowError

from shardflow.flows.catalog_cli import add_lifecycle_parsers, cmd_diff, cmd_gc, cmd_ls, cmd_rm, cmd_show, cmd_validate
from shardflow.flows.catalog_cli import BUCKET_COMMANDS, add_push_parser, cmd_push
from shardflow.flows.card_cli import add_card_parser, cmd_card
from shardflow.flows.terminal import (
    PIPELINE_HINT, PIPELINE_MODULES, check_pipeline_installed, quiet_broken_pipe, stdout_closed,
)
from shardflow.flows.options import (
    _add_build_options, _add_catalog, _add_embed_options, _config, _embed_options, bucket_places_of, check_local_paths,
    count, is_url,
)
from shardflow.flows.progress import BuildProgress, Progress

__all__ = ["main", "build_parser"]

EXIT_USER_ERROR = 2
EXIT_IO_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    from shardflow import __version__

    parser = argparse.ArgumentParser(prog="shardflow", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"shardflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="tokenize sources into a new published version")
    b.add_argument(
        "sources", nargs="+",
        help="Parquet/Arrow/JSON Lines files, directories, globs, save_to_disk datasets, or URLs (file://, s3://...)",
    )
    _add_build_options(b, name_required=True)
    b.add_argument("--no-prefect", action="store_true", help="run the steps in this process, without Prefect")
    b.add_argument(
        "--progress", default="auto", choices=["auto", "bar", "plain", "none"],
        help="progress on stderr: a bar on a terminal, plain lines when piped or under CI (default auto)",
    )

    sv = sub.add_parser(
        "serve",
        help="serve one dataset's build as a deployment, on a cron schedule (several datasets: declare them in "
        "prefect.yaml, docs/OPERATIONS.md)",
        description="Register a build_dataset deployment of one dataset, with its cron schedule and build options, "
        "and run its flow runs until interrupted. Start a run by hand with: prefect deployment run "
        "build-dataset/DEPLOYMENT. Several datasets: declare them in prefect.yaml (docs/OPERATIONS.md).",
    )
    sv.add_argument("sources", nargs="+", help="sources of the dataset, as for build (local paths made absolute)")
    _add_build_options(sv, name_required=True)
    sv.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *' (02:00 daily); without it, runs start by hand only")
    sv.add_argument("--timezone", default=None, help="timezone of --cron (IANA name, default UTC)")
    sv.add_argument("--deployment", help="deployment name (default: the dataset name)")
    sv.add_argument("--limit", type=int, default=None, help="at most this many flow runs at once")
    sv.add_argument("--dry-run", action="store_true", help="print the deployment as JSON and exit")

    v = sub.add_parser("validate", help="check a published version against its manifest")
    v.add_argument("ref", help="NAME@VERSION, NAME@latest, or a version directory / metadata.yaml")
    v.add_argument("--no-checksums", action="store_true", help="skip SHA-256 checks (faster)")
    from shardflow.targets import TARGETS

    v.add_argument("--for", dest="for_target", default=None, choices=list(TARGETS), metavar="TARGET",
                   help=f"also check that TARGET's own reader loads the version, and print its settings ({', '.join(TARGETS)})")
    _add_catalog(v)

    ls = sub.add_parser("ls", help="list datasets, or the versions of one dataset")
    ls.add_argument("name", nargs="?")
    _add_catalog(ls)

    e = sub.add_parser(
        "embed",
        help="add embeddings to a published version (a new version; token shards hard-linked)",
        description="Compute one embedding per document of every split of REF and publish them as a new "
        "version whose parent is REF. The token shards are hard-linked from REF, not copied.",
    )
    e.add_argument("ref", help="NAME@VERSION, NAME@latest, or a version directory / metadata.yaml")
    _add_embed_options(e, prefix="")
    e.add_argument("--data-root", help="where the new version is written (default: beside REF)")
    _add_catalog(e)

    s = sub.add_parser("show", help="print a version's manifest summary")
    s.add_argument("ref")
    s.add_argument("--split", default=None, help="split to sample from (default: train)")
    s.add_argument("--samples", type=count, default=2, help="decoded samples to print")
    s.add_argument("--card", action="store_true", help="print the path of the version's dataset card (card/README.md)")
    _add_catalog(s)

    d = sub.add_parser("diff", help="compare two versions: inputs, per-split tokens and documents, configuration")
    d.add_argument("ref_a")
    d.add_argument("ref_b")
    d.add_argument("--all", action="store_true", help="list unchanged inputs too")
    _add_catalog(d)
    add_card_parser(sub)
    add_lifecycle_parsers(sub)
    add_push_parser(sub)
    return parser


def _check_runner(args: argparse.Namespace) -> None:
    if args.runner == "dask" and not args.address:
        raise ShardflowError("--runner dask needs --address tcp://HOST:PORT, the address of a running Dask scheduler")
    if args.runner != "dask" and args.address:
        raise ShardflowError("--address is for --runner dask")


def _build_without_prefect(args: argparse.Namespace, config: Any, display: Any, bucket: Any) -> str:
    """The driver in this process: on threads, or on a Dask cluster with ``--runner dask``; then, for a build to
    a bucket (``bucket``: its ``BucketPlaces`` and the versions it lists), the push."""
    from shardflow.build import ThreadExecutor, drive

    if args.runner == "dask":
        from shardflow.build.dask_executor import DaskExecutor

        executor: Any = DaskExecutor(args.address)
    else:
        executor = ThreadExecutor(args.workers)
    with executor:
        data_root, catalog = _local_places(args, bucket)
        reuse = None
        if bucket is not None:
            from shardflow.bucket_build import fetch_parent

            reuse = None if fetch_parent(bucket[0], config) else False
        result = drive(config, executor, data_root=data_root, catalog=catalog, reuse=reuse,
                       events=BuildProgress(config.name, display))
    if bucket is not None:
        from shardflow.bucket_build import publish_to_bucket

        publish_to_bucket(bucket[0], result.ref, listed=bucket[1], workers=args.workers)
    display(Progress(dataset=config.name, phase="done", done=1, total=1, ref=result.ref))
    return result.ref


# Set before Prefect is imported (the user's own setting wins): the core's log lines go to Prefect's console and run logs.
PREFECT_DEFAULTS = {"PREFECT_LOGGING_EXTRA_LOGGERS": "shardflow"}


def cmd_build(args: argparse.Namespace) -> int:
    """``shardflow build``: every option and path checked first, then the server, then the flow."""
    config = _checked_build_config(args)
    from shardflow.catalog import Catalog

    places = bucket_places_of(args)
    bucket = None
    if places is not None:
        from shardflow.bucket_build import sync_catalog

        bucket = (places, sync_catalog(places, config.name))
        before = {f"{config.name}@{v}" for v in bucket[1]}
    catalog = Catalog(_local_places(args, bucket)[1])
    if bucket is None:
        # What was published before: a build that ends on one of these published nothing new.
        before = {f"{config.name}@{v.version}" for v in catalog.versions(config.name)} \
            if config.name in catalog.datasets() else set()
    ref = _build(args, config, bucket)
    directory = catalog.resolve(ref)
    if config.target is not None:  # before the two result lines: the last line stays the manifest's path
        from shardflow.flows.targets_cli import print_target_settings

        print_target_settings(config.target, directory)
    where = f" to {places.version_url(ref)}" if places is not None else ""
    latest = f"{config.name}@{catalog.latest(config.name)}"
    # Inputs back to an older version's: that version is theirs, but @latest stays the newer one.
    older = f"; {config.name}@latest is {latest}, built from other inputs: read {ref} for these" if latest != ref else ""
    print(f"nothing new: {ref} is identical{where.replace(' to ', ' at ')}{older}" if ref in before
          else f"published {ref}{where}")
    print(f"{places.version_url(ref)}/metadata.yaml" if places is not None else str(directory / "metadata.yaml"))
    return 0


def _local_places(args: argparse.Namespace, bucket: Any) -> tuple[str | None, str | None]:
    """The data root and catalog the build writes: the options, or a build to a bucket's scratch mirror."""
    return (args.data_root, args.catalog) if bucket is None else (str(bucket[0].data_root), str(bucket[0].catalog))


def _build(args: argparse.Namespace, config: Any, bucket: Any) -> str:
    """The build itself: in this process (``--no-prefect``) or as the flow; the published reference."""
    from shardflow.flows.progress import ProgressDisplay

    display = ProgressDisplay(args.progress)
    if args.no_prefect:
        with display:
            return _build_without_prefect(args, config, display, bucket)
    os.environ.update({**PREFECT_DEFAULTS, **os.environ})
    from shardflow.flows.server import start_server

    # Before Prefect's import: the two overlap. (Dask's workers need a server they can reach: never a temporary one.)
    server = start_server() if args.runner == "threads" else None
    if server is not None and server.process is not None:
        from shardflow.flows.server import build_until_answered

        data_root, catalog = _local_places(args, bucket)
        build_until_answered(server, config, workers=args.workers, data_root=data_root, catalog=catalog)
    try:
        return _run_flow(args, config, display, server)
    finally:
        if server is not None:
            server.stop()


def _run_flow(args: argparse.Namespace, config: Any, display: Any, server: Any) -> str:
    """Run the ``build_dataset`` flow for ``shardflow build`` (on ``server``, if any); its reference."""
    from prefect.settings import get_current_settings

    from shardflow.flows.build import build_dataset, make_task_runner
    from shardflow.flows.progress import listening
    from shardflow.flows.terminal import filtered_console, quiet_prefect_tracebacks, recorded_note
    make_task_runner(args.runner, args.address, args.workers)  # its checks (Dask: a real server), before any run
    quiet_prefect_tracebacks()
    with filtered_console() as console:
        try:
            with server.serve() if server else contextlib.nullcontext(None) as temporary, display, \
                    listening(display):
                # A temporary server: ours, or Prefect's own (no API URL) when we started none.
                console.hide_links = temporary if temporary is not None else not get_current_settings().api.url
                ref = build_dataset(
                    config=config,
                    workers=args.workers,
                    data_root=args.data_root,
                    catalog=args.catalog,
                    runner=args.runner,
                    address=args.address,
                    scratch=args.scratch,
                )
        finally:
            if console.hide_links and console.run_path:  # the server is gone: its link would be dead
                print(recorded_note(console.run_path), file=sys.stderr, flush=True)
    return str(ref)


def check_sources_exist(sources: Sequence[str]) -> None:
    """Refuse a local source that names nothing (a missing path, a glob matching no file), before any server starts.

    Planning finds the inputs again and checks the rest (kinds, empty directories); URLs are listed there.
    """
    import glob

    for source in sources:
        if "://" in source or os.path.exists(source):
            continue
        if not any(c in source for c in "*?["):
            raise ShardflowError(f"{source}: no such file or directory; check the path")
        if not glob.glob(source, recursive=True):
            raise ShardflowError(f"{source}: the pattern matches no files; check the path and the pattern")


def _checked_build_config(args: argparse.Namespace) -> Any:
    """The build's config, after every check that needs no server: options, paths, the pipeline's packages."""
    if args.workers < 1:
        raise ShardflowError(f"--workers must be at least 1, not {args.workers}")
    _check_runner(args)
    bucket_places_of(args)  # a bucket's URLs checked, or no URL where only a local directory works
    check_sources_exist(args.sources)
    check_pipeline_installed(args)
    config = _config(args)
    if config.embed is not None and args.runner == "threads":  # the embedding jobs run on this machine
        from shardflow.embedder import check_available

        check_available(config.embed)
    return config


def _absolute(path: str | None) -> str | None:
    """A local path made absolute (a served run may start in another directory); a URL as given."""
    return path if path is None or is_url(path) else os.path.abspath(os.path.expanduser(path))


def _schedules(cron: str | None, timezone: str | None) -> list[Any] | None:
    """``--cron`` and ``--timezone`` as Prefect's schedule; a bad one is a user error naming its option."""
    if cron is None:
        if timezone is not None:
            raise ShardflowError("--timezone is the timezone of --cron; give --cron 'MIN HOUR DOM MON DOW' too")
        return None
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron

    try:
        schedule = Cron(cron, timezone=timezone)
    except ValueError as exc:
        raise ShardflowError(f"--cron {cron!r}: {exc}; give five fields MIN HOUR DOM MON DOW, "
                             "e.g. '0 2 * * *' (02:00 daily)") from None
    try:  # Cron checks the cron only; the timezone is checked when the deployment is made
        CronSchedule(cron=cron, timezone=timezone)
    except ValueError:
        raise ShardflowError(f"--timezone {timezone!r}: not a timezone; give an IANA name, e.g. UTC or "
                             "Europe/Paris") from None
    return [schedule]


def cmd_serve(args: argparse.Namespace) -> int:
    """``shardflow serve``: one deployment of ``build_dataset``, served by this process (``prefect.serve``)."""
    import json

    if args.workers < 1:
        raise ShardflowError(f"--workers must be at least 1, not {args.workers}")
    _check_runner(args)
    bucket_places_of(args)  # a bucket's URLs checked, or no URL where only a local directory works
    config = _config(args)
    config = config.replace(sources=tuple(_absolute(s) or s for s in config.sources))
    if not args.dry_run:
        os.environ.update({**PREFECT_DEFAULTS, **os.environ})  # before Prefect's import
    schedules = _schedules(args.cron, args.timezone)
    from shardflow.flows.build import build_dataset, dataset_tag
    from shardflow.tasks.build import TAGS

    deployment = build_dataset.to_deployment(
        name=args.deployment or config.name,
        schedules=schedules,
        parameters={"config": config.to_dict(), "workers": args.workers, "data_root": _absolute(args.data_root),
                    "catalog": _absolute(args.catalog), "runner": args.runner, "address": args.address,
                    "scratch": _absolute(args.scratch)},
        tags=[*TAGS, dataset_tag(config.name)],
        description=f"Build the {config.name} dataset",
    )
    name = f"{deployment.flow_name}/{deployment.name}"
    if args.dry_run:
        print(json.dumps({"deployment": name, "cron": args.cron, "timezone": args.timezone, "tags": deployment.tags,
                          "parameters": deployment.parameters, "description": deployment.description}, indent=2))
        return 0
    from prefect import serve

    when = f"cron {args.cron!r} ({args.timezone or 'UTC'})" if args.cron else "no schedule (runs start by hand)"
    print(f"serving {name}: {config.name} from {', '.join(config.sources)}, {when}", flush=True)
    serve(deployment, limit=args.limit)
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from shardflow.build import embed_version

    result = embed_version(args.ref, _embed_options(args), catalog=args.catalog, data_root=args.data_root)
    if result.created:
        print(f"published {result.ref} (embeddings of {args.ref})")
    else:
        print(f"{result.ref} already holds these embeddings of {args.ref}; nothing new was published")
    print(result.manifest_path)
    return 0


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
        from shardflow.bucket_build import default_scratch

        places["--scratch"] = default_scratch(args.scratch)
    return places


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shardflow`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
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


def run() -> None:
    """The ``shardflow`` console script: :func:`main`, and after a flow, an exit without the interpreter's teardown.

    Tearing down an interpreter that loaded Prefect takes 0.6 s here (its
    threads stopped, its modules freed one by one): 12% of the first command
    against a running server. Prefect's queued logs and events are sent first
    (its public ``drain_all``), then the process ends (``os._exit``).
    """
    code = main()
    if "prefect" in sys.modules:
        from shardflow.flows.server import drain_prefect_workers

        drain_prefect_workers()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
