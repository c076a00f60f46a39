"""The commands that end or move a version's life: ``rm``, ``gc``, ``push`` (with ``--repair``).

``rm`` and ``gc`` end a version's life (``shardflow.lifecycle``): a version removed, catalog
entry first; abandoned staging directories and what an interrupted ``rm`` left, with their
sizes. ``push`` publishes a version to object storage (``shardflow.bucket.push``), and
``push --repair`` mends a bucket version's objects (``shardflow.bucket.repair``).
``rm --catalog s3://...`` and ``gc --data-root s3://... --catalog s3://...`` work on a bucket
(``shardflow.bucket.lifecycle``). ``cli.commands`` registers them (``add_lifecycle_parsers``
declares their options); errors are ``ShardflowError``s: one message, exit 2.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from shardflow.errors import ShardflowError

__all__ = ["add_lifecycle_parsers", "cmd_rm", "cmd_gc", "cmd_push", "byte_size"]


def add_lifecycle_parsers(sub: Any) -> None:
    """Add ``rm``, ``gc`` and ``push`` to the command line's subcommands (``sub``: what ``add_subparsers`` returned)."""
    from .options import add_command

    r = add_command(
        sub, "rm", "remove a published version: its catalog entry, then its directory",
        "Remove NAME@vN: its catalog entry first (the catalog's latest becomes the newest remaining "
        "version), then its directory. A version that a remaining one names as its parent is refused unless "
        "--force (the child's shards are hard links: it keeps working). Rerun after an interruption, it "
        "finishes the job. A removed version's name is never given again. A version that a reader holds open (a "
        "training job pins it: a shared lock on its directory, per node) is refused, naming the process, unless "
        "--force. With --catalog s3://BUCKET/catalog, the "
        "entry is taken out of the bucket's NAME.yaml (a conditional write), then every object under the version's "
        "prefix is deleted (a child's objects are its own copies there: it keeps working).",
        ref="NAME@vN (the version to remove; NAME@latest is refused: name it)")
    r.add_argument("--force", action="store_true",
                   help="remove it even if remaining versions name it as their parent, or while readers hold it open "
                   "(they fail at the next shard they open)")

    g = add_command(
        sub, "gc", "remove abandoned staging directories and what interrupted removals left, with their sizes",
        "Remove the staging directories that no rerun would resume (their build is published, or an "
        "older shardflow staged them; never one whose build is running) and the files of versions whose "
        "shardflow rm was interrupted. Staging directories of unfinished builds are kept: a rerun resumes them. "
        "On a bucket (--data-root s3://BUCKET/data --catalog s3://BUCKET/catalog): abort incomplete multipart uploads "
        "under the data root, and delete the version prefixes NAME/vN/ there that the catalog does not list (abandoned "
        "pushes and builds, interrupted removals), those older than --older-than hours; never a listed version.",
        ref=None)
    g.add_argument("--dry-run", action="store_true", help="print what would be removed, and remove nothing")
    g.add_argument("--force", action="store_true",
                   help="also remove what interrupted removals left that a reader still holds open")
    g.add_argument("--data-root", help="where versions are written (default: $SHARDFLOW_DATA_ROOT or ./data); "
                   "s3://BUCKET/PREFIX with --catalog s3://BUCKET/PREFIX: the bucket's leftovers")
    g.add_argument("--older-than", type=float, metavar="HOURS",
                   help="on a bucket: only uploads and unlisted versions last written more than HOURS ago (default 24: "
                   "a bucket has no locks, and a push in progress must not be disturbed)")

    p = add_command(
        sub, "push", "publish a version to object storage, with a catalog in the bucket",
        "Validate NAME@vN (checksums), upload its files under DATA_ROOT_URL/NAME/vN/ (metadata.yaml last; "
        "files of the parent version already in the bucket are copied there, not sent again), then list it in "
        "CATALOG_URL/NAME.yaml with a conditional write: the commit point, before which no reader sees it. Rerun "
        "after an interruption, it resumes; the same build pushed again is reported as already pushed. Training "
        "jobs read it with catalog=CATALOG_URL. Credentials and endpoint: AWS_* in the environment. With --repair "
        "(and --catalog s3://BUCKET/catalog, or --catalog-url): read every object of the version the bucket "
        "catalog lists, by content, and send again each one that is missing or damaged, from a local copy that "
        "verifies (--from DIR, the scratch of builds to the bucket, the runtime cache), or where none does, from a "
        "rebuild of the version from the inputs and options its manifest records (published nowhere).",
        ref="NAME@vN (or NAME@latest) in the local catalog (with --repair: in the bucket catalog)")
    p.add_argument("--data-root-url", help="where versions go in the bucket, e.g. s3://BUCKET/data (required but with "
                   "--repair)")
    p.add_argument("--catalog-url",
                   help="the bucket's catalog, in the same bucket, e.g. s3://BUCKET/catalog (what readers pass as catalog=)")
    p.add_argument("--workers", type=int, default=8, help="files sent (with --repair: objects checked) at once (default 8)")
    p.add_argument("--repair", action="store_true",
                   help="check the bucket's copy of NAME@vN by content and restore its missing or damaged objects from "
                   "verified local copies")
    p.add_argument("--from", dest="sources", action="append", default=[], metavar="DIR",
                   help="with --repair: a directory holding a copy of the version's files (a local data root's NAME/vN, "
                   "or a rebuild's); repeatable; looked in before the scratch and the runtime cache")
    p.add_argument("--no-rebuild", action="store_true",
                   help="with --repair: do not rebuild what no local copy has (by default the version is built again "
                   "from the inputs and options its manifest records, in a temporary directory under the scratch, "
                   "published nowhere, and its files that verify are sent)")
    p.add_argument("--scratch", default=None,
                   help="with --repair: the scratch of builds to the bucket (default: $SHARDFLOW_SCRATCH or "
                   "~/.cache/shardflow/scratch)")


def byte_size(n: int) -> str:
    """Bytes for a person: ``512 B``, ``1.4 MiB``."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _given(args: argparse.Namespace, option: str, env: str) -> tuple[str | None, str]:
    """An option's value, else its environment variable's, and how to name it in a message."""
    value = getattr(args, option[2:].replace("-", "_"))
    return (value, option) if value else (os.environ.get(env), f"${env}")


def _rm_bucket(args: argparse.Namespace, catalog: str, option: str) -> int:
    from shardflow.bucket.lifecycle import remove_bucket_version

    r = remove_bucket_version(args.ref, catalog_url=catalog, force=args.force, option=option)
    if r.resumed and not r.objects:
        print(f"{r.ref} was already removed; nothing of it was left under {r.url}/")
        return 0
    done = "finished removing" if r.resumed else "removed"
    print(f"{done} {r.ref} ({r.url}/): {r.objects} object{'s' if r.objects != 1 else ''} deleted, {byte_size(r.bytes)}")
    for child in r.orphaned:
        print(f"  {child} named it as its parent; its objects are its own copies in the bucket, so it still reads")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from shardflow.cli.options import is_url
    from shardflow.lifecycle import remove_version

    catalog, option = _given(args, "--catalog", "SHARDFLOW_CATALOG")
    if catalog and is_url(catalog):
        return _rm_bucket(args, catalog, option)
    r = remove_version(args.ref, catalog=args.catalog, force=args.force)
    if r.resumed and not r.left:
        print(f"{r.ref} was already removed; nothing of it was left in {r.directory.parent}")
        return 0
    kept = f"; {byte_size(r.shared)} kept, hard-linked by other versions" if r.shared else ""
    done = "finished removing" if r.resumed else "removed"
    print(f"{done} {r.ref} ({r.directory}): {byte_size(r.freed)} freed{kept}")
    for child in r.orphaned:
        print(f"  {child} named it as its parent; its shards are its own hard links, so it still reads and validates")
    return 0


def _gc_bucket(args: argparse.Namespace, data_root: str, catalog: str) -> int:
    from shardflow.bucket.lifecycle import collect_bucket_garbage

    hours = 24.0 if args.older_than is None else args.older_than
    found = collect_bucket_garbage(data_root_url=data_root, catalog_url=catalog, dry_run=args.dry_run,
                                   older_than_hours=hours)
    for g in found:
        verb = ("would abort" if args.dry_run else "aborted") if g.upload else ("would delete" if args.dry_run else "deleted")
        unit = "part" if g.upload else "object"
        print(f"{verb} {g.url} ({g.objects} {unit}{'s' if g.objects != 1 else ''}, {byte_size(g.bytes)}): {g.why}")
    if not found:
        print(f"nothing to remove under {data_root.rstrip('/')} (uploads, unlisted versions and builds' job records "
              f"written in the last {hours:.12g} hours are kept, and those of a build whose lease is live)")
    else:
        n = len(found)
        print(f"{'would free' if args.dry_run else 'freed'} {byte_size(sum(g.bytes for g in found))} ({n} item{'s' if n != 1 else ''})")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    import sys

    from shardflow.catalog import default_data_root
    from shardflow.errors import ConfigError
    from shardflow.cli.options import is_url
    from shardflow.lifecycle import collect_garbage

    data_root, root_name = _given(args, "--data-root", "SHARDFLOW_DATA_ROOT")
    catalog, cat_name = _given(args, "--catalog", "SHARDFLOW_CATALOG")
    remote = [bool(value) and is_url(str(value)) for value in (data_root, catalog)]
    if all(remote):
        assert data_root is not None and catalog is not None
        return _gc_bucket(args, data_root, catalog)
    if any(remote):
        option, value = ("--catalog", catalog) if remote[0] else ("--data-root", data_root)
        named = f"{cat_name if remote[0] else root_name} {value}" if value else f"{option} (unset)"
        raise ConfigError(f"{named}: gc on a bucket needs both --data-root and --catalog on it, in one bucket, e.g. "
                          "--data-root s3://BUCKET/data --catalog s3://BUCKET/catalog")
    if args.older_than is not None:
        raise ConfigError(f"--older-than {args.older_than:.12g}: only gc on a bucket has an age threshold (a local gc "
                          "asks each build's lock whether it is running); leave it out")
    found = collect_garbage(data_root=args.data_root, catalog=args.catalog, dry_run=args.dry_run,
                            force=args.force)
    kept = [g for g in found if g.kept]
    found = [g for g in found if not g.kept]
    verb = "would remove" if args.dry_run else "removed"
    for g in found:
        print(f"{verb} {g.path} ({byte_size(g.freed)}): {g.why}")
    if not found and not kept:
        print(f"nothing to remove under {default_data_root(args.data_root)}")
    elif found:
        n = len(found)
        print(f"{'would free' if args.dry_run else 'freed'} {byte_size(sum(g.freed for g in found))} "
              f"({n} director{'ies' if n != 1 else 'y'})")
    for g in kept:  # refused in one line each, as rm refuses a pinned version; the rest is done
        print(f"shardflow: {'would keep' if args.dry_run else 'error: kept'} {g.path}: {g.kept}", file=sys.stderr)
    return 2 if kept and not args.dry_run else 0


def _push_repair(args: argparse.Namespace) -> int:
    """``push NAME@vN --repair``: the bucket catalog is ``--catalog-url``, else ``--catalog`` (or
    ``$SHARDFLOW_CATALOG``), an s3:// URL."""
    import sys

    from shardflow.bucket.repair import repair_bucket_version
    from shardflow.cli.options import is_url
    from shardflow.cli.progress import CheckProgress
    from shardflow.errors import ConfigError

    catalog, option = (args.catalog_url, "--catalog-url") if args.catalog_url else _given(args, "--catalog", "SHARDFLOW_CATALOG")
    if not catalog or not is_url(catalog):
        raise ConfigError(f"{option if catalog else '--catalog'} {catalog or '(unset)'}: push --repair needs the bucket catalog that lists the version, "
                          "e.g. --catalog s3://BUCKET/catalog")
    progress = CheckProgress(f"push --repair {args.ref}")
    r = repair_bucket_version(args.ref, catalog_url=catalog, sources=args.sources, scratch=args.scratch,
                              workers=args.workers, progress=progress.phase("checked", "objects"),
                              no_rebuild=args.no_rebuild,
                              on_rebuild=lambda line: print(f"shardflow: push --repair: {line}", file=sys.stderr))
    if not r.restored:
        print(f"{r.ref}: all {r.checked} objects under {r.url}/ are the manifest's; nothing to repair")
        return 0
    rebuilt = f" ({len(r.rebuilt)} rebuilt from the version's inputs)" if r.rebuilt else ""
    print(f"repaired {r.ref} ({r.url}/): {len(r.restored)} of {r.checked} objects restored{rebuilt}")
    for file, why, copy in r.restored:
        print(f"  {file}: {why}; rebuilt from {copy} and sent again" if file in r.rebuilt else
              f"  {file}: {why}; sent again from {copy}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from shardflow.bucket.push import push_version
    from shardflow.cli.options import check_local_paths
    from shardflow.errors import ConfigError

    if args.workers < 1:
        raise ShardflowError(f"--workers {args.workers}: give at least 1")
    if args.repair:
        return _push_repair(args)
    if args.sources or args.scratch or args.no_rebuild:
        given = "--from" if args.sources else "--scratch" if args.scratch else "--no-rebuild"
        raise ConfigError(f"{given}: only push --repair takes it")
    check_local_paths(args)  # --catalog is the local catalog here (with --repair, the bucket's)
    missing = [o for o, v in (("--data-root-url", args.data_root_url), ("--catalog-url", args.catalog_url)) if not v]
    if missing:
        raise ConfigError(f"push needs {' and '.join(missing)} (where the version goes in the bucket), e.g. "
                          "--data-root-url s3://BUCKET/data --catalog-url s3://BUCKET/catalog; or --repair")
    r = push_version(args.ref, data_root_url=args.data_root_url, catalog_url=args.catalog_url, catalog=args.catalog,
                     workers=args.workers)
    if r.already:
        print(f"{r.ref} was already pushed: {r.url} (catalog {r.catalog_file}; its objects were not read: "
              "push --repair checks them by content)")
        return 0
    copied = f", {r.copied} copied from {r.parent}" if r.copied else ""
    skipped = f", {r.skipped} already there" if r.skipped else ""
    print(f"pushed {r.ref} to {r.url}: {r.uploaded} files uploaded ({byte_size(r.uploaded_bytes)}){copied}{skipped}; "
          f"listed in {r.catalog_file}")
    return 0
