"""``shardflow build``, ``serve`` and ``embed``: the request made and checked here, the work done elsewhere.

``build`` runs the ``build_dataset`` Prefect flow (``shardflow.flows.launch``;
on Prefect's temporary local server unless ``PREFECT_API_URL`` points at a real
one), or with ``--no-prefect`` the same driver in this process
(``pipeline.run_request``). It prints the published reference, and the path of
the version's ``metadata.yaml`` as the last line of standard output. A rebuild
that finds the identical version prints ``nothing new: NAME@vN is identical``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

from shardflow.errors import ShardflowError

from .options import build_config, embed_flag_names, embed_options, flags_named, is_url
from .progress import BuildProgress, Progress, ProgressDisplay, announce
from .terminal import check_pipeline_installed

__all__ = ["cmd_build", "cmd_serve", "cmd_embed", "request_of", "check_sources_exist"]


def request_of(args: argparse.Namespace, *, absolute: bool = False) -> Any:
    """The ``BuildRequest`` of a ``build`` or ``serve`` command line (``absolute``: local paths made absolute, for a
    served run that may start in another directory). Its checks run as it is made."""
    from shardflow.pipeline.request import BuildRequest

    config = build_config(args)
    place = _absolute if absolute else (lambda path: path)
    if absolute:
        config = config.replace(sources=tuple(_absolute(s) or s for s in config.sources))
    request = BuildRequest(config=config, workers=args.workers, runner=args.runner, address=args.address,
                           data_root=place(args.data_root), catalog=place(args.catalog), scratch=place(args.scratch))
    if request.places is None:
        from .options import check_local_paths

        check_local_paths(args)  # no URL where only a local directory works, no file where a directory goes
    return request


def cmd_build(args: argparse.Namespace) -> int:
    """``shardflow build``: every option and path checked first, then the build (the flow, or this process)."""
    check_sources_exist(args.sources)
    check_pipeline_installed(args)
    request = request_of(args)
    announce(request, args.progress)  # what will be built, at once: before the embedder, the server, Prefect's import
    if request.config.embed is not None and request.runner == "threads":  # the embedding jobs run on this machine
        from shardflow.embed.embedder import check_available

        check_available(request.config.embed)
    display = ProgressDisplay(args.progress)
    if args.no_prefect:
        with display:
            result = _build_here(request, display)
    else:
        from shardflow.flows.launch import build_with_prefect

        result = build_with_prefect(request, display)
    _report(request, result)
    return 0


def _build_here(request: Any, display: Any) -> Any:
    """The driver in this process: on threads, or on a Dask cluster with ``--runner dask``."""
    from shardflow.pipeline import ThreadExecutor, run_request

    if request.runner == "dask":
        from shardflow.pipeline.dask_executor import DaskExecutor

        executor: Any = DaskExecutor(request.address)
    else:
        executor = ThreadExecutor(request.workers)
    with executor:
        progress = BuildProgress(request.config.name, display)
        result = run_request(request, progress.watching(executor), progress)  # jobs found done: not speed
    display(Progress(dataset=request.config.name, phase="done", done=1, total=1, ref=result.ref))
    return result


def _report(request: Any, result: Any) -> None:
    """The two result lines (the target's settings before them: the last line stays the manifest's path)."""
    from shardflow.catalog import Catalog

    name, ref = request.config.name, result.ref
    catalog = Catalog(request.local[1])
    if request.config.target is not None:
        from .targets import print_target_settings

        print_target_settings(request.config.target, catalog.resolve(ref))
    places = request.places
    where = f" to {places.version_url(ref)}" if places is not None else ""
    latest = f"{name}@{catalog.latest(name)}"
    # Inputs back to an older version's: that version is theirs, but @latest stays the newer one.
    older = f"; {name}@latest is {latest}, built from other inputs: read {ref} for these" if latest != ref else ""
    print((f"published {ref}{where}" if result.created
           else f"nothing new: {ref} is identical{where.replace(' to ', ' at ')}{older}")
          + _empty_val(request.config, result.manifest_path))
    print(result.manifest_path)


def _empty_val(config: Any, manifest_path: str) -> str:
    """The summary's note when ``--val-fraction`` asked for a val split that came out empty (else ''), read from the
    version's manifest (a build to a bucket may keep no local copy of it: then nothing is said)."""
    if not config.val_fraction or not manifest_path or not os.path.isfile(manifest_path):
        return ""
    from shardflow.manifest import read_manifest

    splits = read_manifest(manifest_path).splits
    if "val" not in splits or splits["val"].documents:
        return ""
    documents = sum(split.documents for split in splits.values())
    return (f"; its val split is empty: --val-fraction {config.val_fraction:g} selected none of its "
            f"{documents:,} document{'' if documents == 1 else 's'} (raise --val-fraction, or use --val-count N)")


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


def _absolute(path: str | None) -> str | None:
    """A local path made absolute (a served run may start in another directory); a URL as given."""
    return path if path is None or is_url(path) else os.path.abspath(os.path.expanduser(path))


def cmd_serve(args: argparse.Namespace) -> int:
    """``shardflow serve``: one deployment of ``build_dataset``, served by this process (``prefect.serve``)."""
    request = request_of(args, absolute=True)
    from shardflow.flows.launch import serve_deployment

    return serve_deployment(request, cron=args.cron, timezone=args.timezone, name=args.deployment or request.config.name,
                            limit=args.limit, dry_run=args.dry_run)


def cmd_embed(args: argparse.Namespace) -> int:
    """``shardflow embed``: embeddings of a published version, as a new version."""
    from shardflow.pipeline import embed_version

    with flags_named(embed_flag_names()):  # a refusal of the version (--dim above its documents) names the flag
        result = embed_version(args.ref, embed_options(args), catalog=args.catalog, data_root=args.data_root)
    if result.created:
        from shardflow.catalog import Catalog

        name = result.ref.partition("@")[0]
        latest = f"{name}@{Catalog(args.catalog).latest(name)}"
        # An older version's embeddings: @latest stays the newer version (docs/OPERATIONS.md).
        stays = f"; {name}@latest stays {latest}" if latest != result.ref else ""
        print(f"published {result.ref} (embeddings of {args.ref}){stays}")
    else:
        print(f"{result.ref} already holds these embeddings of {args.ref}; nothing new was published")
    print(result.manifest_path)
    return 0
