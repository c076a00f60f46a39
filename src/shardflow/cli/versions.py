"""The catalog's commands: the read-only ``validate``, ``ls``, ``show``, ``diff``; and ``rm``, ``gc``.

They read published versions through the core (``shardflow.catalog``,
``shardflow.reader``) and never import Prefect, so they answer in a fraction of
a second. ``rm`` and ``gc`` end a version's life (``shardflow.lifecycle``): a
version removed, catalog entry first; abandoned staging directories and what an
interrupted ``rm`` left, with their sizes. ``cli.commands`` registers them in its
``COMMANDS`` (``add_lifecycle_parsers`` declares the last two); errors are
``ShardflowError``s, which the command line turns into one message and exit 2.
``push`` publishes a version to object storage (``shardflow.bucket.push``; ``add_push_parser``).
``rm --catalog s3://...`` and ``gc --data-root s3://... --catalog s3://...`` work on a
bucket (``shardflow.bucket.lifecycle``); the four readers read one through the runtime's verified
cache (``shardflow.runtime.remote``: ``show`` and ``diff`` fetch only what they print). These
commands check their own URLs (``BUCKET_COMMANDS``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from shardflow.errors import ShardflowError

__all__ = ["cmd_validate", "cmd_ls", "cmd_show", "cmd_diff", "add_lifecycle_parsers", "cmd_rm", "cmd_gc"]
__all__ += ["cmd_push", "BUCKET_COMMANDS"]

BUCKET_COMMANDS = frozenset({"rm", "gc", "validate", "ls", "diff", "show", "push"})
"""Commands that take s3:// URLs as --data-root and --catalog and check them themselves (the others refuse URLs)."""


def cmd_validate(args: argparse.Namespace) -> int:
    import sys

    from shardflow.catalog import asked_name_problem, resolve_version, vouch_for
    from shardflow.errors import ValidationError
    from shardflow.manifest import read_manifest
    from shardflow.runtime.remote import fetch_version, is_remote_ref
    from shardflow.validation import validate_dir

    from shardflow.cli.progress import CheckProgress
    from shardflow.runtime.remote import FETCH_WORKERS, REPAIR_COMMAND

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")
    workers = getattr(args, "workers", None)
    progress = CheckProgress(f"validate {args.ref}")
    if is_remote_ref(args.ref, catalog):
        # On a bucket: every object streamed from the bucket again, whatever the cache holds, and hashed against
        # the manifest's SHA-256 as it arrives (the manifest against the bucket catalog's entry): the bucket is
        # what is validated. The verified copies replace the cache's; then the same checks as a local version's.
        try:
            url, directory, manifest = fetch_version(args.ref, catalog=catalog, verify=not args.no_checksums,
                                                     refetch=not args.no_checksums, workers=workers or FETCH_WORKERS,
                                                     progress=progress.phase("fetched"))
        except ValidationError as exc:  # a damaged object: the repair command, for this version and catalog
            if "@" not in str(args.ref) or catalog is None or REPAIR_COMMAND not in str(exc):
                raise
            raise ValidationError(str(exc).replace(
                REPAIR_COMMAND, f"shardflow push {args.ref} --repair --catalog {catalog.rstrip('/')}")) from None
        report = validate_dir(directory, manifest, checksums=False, workers=workers,
                              progress=progress.phase("checked", "shards"))
        shown: Any = url
    else:
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        directory, asked = resolve_version(args.ref, args.catalog)  # NAME@REF: the catalog's, never a folder
        manifest = read_manifest(directory)
        standalone = getattr(args, "standalone", False)
        if standalone and (vouch := vouch_for(directory, manifest, args.catalog)).catalog is None:
            print(f"note: {vouch.unlisted(directory)}; --standalone: its files are checked against its own manifest "
                  "only", file=sys.stderr)
        # A path is checked against the catalog that published it; one that no catalog lists fails, unless --standalone.
        report = validate_dir(directory, manifest, checksums=not args.no_checksums, published=True, catalog=args.catalog,
                              standalone=standalone, workers=workers, progress=progress.phase("checked", "shards"))
        wrong = asked_name_problem(asked, manifest, directory)  # (the catalog's entry says so first, if it lists it)
        if wrong:
            raise ValidationError(wrong)
        shown = directory
    if args.for_target is not None:  # before "OK": a version the trainer cannot load is not OK for it
        from shardflow.cli.targets import check_target

        check_target(args.for_target, directory, manifest)
    fmt = manifest.format
    print(f"OK {manifest.ref}: {report.shards} shards, {report.tokens} tokens, {report.documents} documents")
    print("settings for a training job:")
    print(f"  path:          {shown}")
    print(f"  file pattern:  {fmt.get('file_pattern')}")
    print(f"  format:        {fmt['name']} (header {fmt.get('header_bytes', 0)} bytes)")
    print(f"  dtype:         {manifest.dtype}")
    print(f"  vocab_size:    {manifest.tokenized_info['vocab_size']}")
    print(f"  boundary:      {manifest.boundary_tokens.describe()}")
    for split, entry in manifest.splits.items():
        print(f"  {split:6s}         {len(entry.shards)} shards, {entry.tokens} tokens, {entry.documents} documents")
    if args.for_target is not None:
        from shardflow.cli.targets import print_target_settings

        print_target_settings(args.for_target, directory, manifest)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    import posixpath
    import tempfile
    from pathlib import Path

    from shardflow.catalog import Catalog
    from shardflow.runtime.remote_store import is_remote, mirror_catalog, renamed

    url = args.catalog or os.environ.get("SHARDFLOW_CATALOG") or ""
    if not is_remote(url):
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        cat = Catalog(args.catalog)
        return _ls(args, cat, str(cat.path), lambda v: str(cat.version_dir(v)))
    # A catalog in a bucket: its files read into a scratch copy, paths shown as the bucket's URLs.
    scheme, _, base = url.rstrip("/").partition("://")
    with tempfile.TemporaryDirectory(prefix="shardflow-ls-") as tmp:
        cat = mirror_catalog(url, Path(tmp))
        try:
            return _ls(args, cat, url.rstrip("/"), lambda v: f"{scheme}://{posixpath.normpath(posixpath.join(base, v.path))}")
        except ShardflowError as exc:
            raise renamed(exc, Path(tmp), url.rstrip("/")) from None


def _ls(args: argparse.Namespace, cat: Any, shown: str, where: Any) -> int:
    """``shardflow ls`` of ``cat``, named ``shown``; ``where(entry)``: a version's directory or URL."""
    if args.name is None:
        names = cat.datasets()
        if not names:
            print(f"no datasets in {shown}")
        for name in names:
            versions = cat.versions(name)
            print(f"{name}\t{len(versions)} version{'s' if len(versions) != 1 else ''}\tlatest {cat.latest(name)}")
        return 0
    if args.name not in cat.datasets():
        raise ShardflowError(f"no dataset {args.name!r} in the catalog {shown}")
    latest = cat.latest(args.name)
    for v in cat.versions(args.name):
        mark = "*" if v.version == latest else " "
        t = v.totals
        print(
            f"{mark} {args.name}@{v.version}\t{v.created_at}\t{t.get('documents')} docs\t{t.get('tokens')} tokens\t"
            f"{t.get('shards')} shards\tparent {v.parent or '-'}\t{where(v)}"
        )
    return 0


def _print_embeddings(m: Any) -> None:
    info = m.extra.get("embeddings")
    if not info:
        return
    # Here, not above: its codecs need ml_dtypes, which the runtime-only install lacks (and needs for no other version).
    from shardflow.embed.files import embedding_parts

    print(f"  embeddings: {info['model']} ({info['dim']} dims, {info['precision']}, {info['long_docs']} long documents), "
          f"codec {info['codec']}; floors: mean cosine >= {info['floors']['min_mean_cosine']}, "
          f"recall@10 >= {info['floors']['min_recall_at_10']}")
    pca = info.get("pca")
    if pca:
        print(f"  PCA: {pca['input_dim']} -> {pca['dim']} dims, explained variance {pca['explained_variance_ratio']:.4f} "
              f"(fitted on {pca['sample_rows']} {pca['fit_split']} rows; {pca['mean']['file']}, {pca['components']['file']}); "
              f"floors: mean cosine >= {pca['floors']['min_mean_cosine']}, recall@10 >= {pca['floors']['min_recall_at_10']}")
    for split, entry in m.splits.items():
        section = entry.extra.get("embeddings")
        if not section:
            continue
        q = section.get("quality") or {}
        quality = (f"mean cosine {q['mean_cosine']:.5f}, min cosine {q['min_cosine']:.5f}, "
                   f"recall@{q['k']} {q['recall_at_k']:.3f} on {q['rows']} rows") if q else "quality not measured"
        parts = embedding_parts(section)
        where = parts[0]["file"] if len(parts) == 1 else f"{len(parts)} files (one per shard)"
        print(f"    {split}: {section['rows']} rows in {where} ({section['bytes']} bytes; "
              f"{section['truncated']} truncated); {'codec ' if pca else ''}{quality}")
        p = section.get("pca_quality")
        if p:
            print(f"      after the PCA, against float32 in {pca['input_dim']} dims: reconstruction mean cosine "
                  f"{p['mean_cosine']:.5f} (min {p['min_cosine']:.5f}), recall@{p['k']} {p['recall_at_k']:.3f} "
                  f"in the reduced space ({p['recall_at_k_reconstructed']:.3f} among reconstructions)")


def cmd_show(args: argparse.Namespace) -> int:
    from shardflow.card import CARD_DIR, CARD_NAME
    from shardflow.reader import Version, open_version
    from shardflow.runtime.remote import RemoteShardSet, is_remote_ref, remote_version
    from shardflow.stats import read_stats

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")
    if is_remote_ref(args.ref, catalog):
        # On a bucket: the manifest, then only what the report reads (each file verified as it arrives): the
        # statistics, the split's document indexes and the shards its samples come from.
        from shardflow.manifest_files import named_files

        cache, m = remote_version(args.ref, catalog=catalog)
        _check_split(args, m)
        for f in named_files(m):
            # The statistics, and the tokenizer's copy that the samples are decoded with (its size unrecorded).
            if f.sha256 and (f.name in ("stats.json", "stats.vocab.npy") or f.where.startswith("tokenized_info.")):
                cache.ensure(f.name, cache.object_size(f.name) if f.size is None else f.size, f.sha256)
        stats = read_stats(cache.directory, m)
        # The card is pushed with the version (not named in its manifest) wherever it has statistics.
        card = f"{cache.url}/{CARD_DIR}/{CARD_NAME}" if stats is not None else None
        shards = RemoteShardSet.over(cache, m, args.split or "train", version=Version(cache.directory, m))
        return _show(args, m, where=cache.url, card=card, shards=shards, stats=stats)
    from shardflow.cli.options import check_local_paths

    check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
    version = open_version(args.ref, catalog=args.catalog)
    m = version.manifest
    _check_split(args, m)
    card = version.directory / CARD_DIR / CARD_NAME
    # inspect_version takes a reference; the resolved version directory is one.
    return _show(args, m, where=str(version.directory), card=str(card) if card.is_file() else None,
                 shards=version.directory, stats=read_stats(version.directory, m))


def _check_split(args: argparse.Namespace, m: Any) -> None:
    if args.split and args.split not in m.splits:  # checked before anything is printed
        raise ShardflowError(f"{m.ref} has no split {args.split!r}; give --split one of {', '.join(m.splits)}")


def _show(args: argparse.Namespace, m: Any, *, where: str, card: str | None, shards: Any, stats: Any) -> int:
    """``shardflow show`` of the version ``m`` at ``where`` (a directory or a URL): ``card`` (None: it has none),
    ``shards`` (what ``inspect_version`` opens), ``stats`` (its statistics, or None)."""
    from shardflow.runtime.inspect import inspect_version
    from shardflow.stats import summary_lines

    if args.card:
        if card is None:
            raise ShardflowError(f"{where}: {m.ref} has no dataset card (built before statistics, or with --no-stats)")
        print(card)
        return 0
    print(f"{m.ref}  ({where})")
    if m.description:
        print(f"  {m.description}")
    print(f"  created {m.created_at}, parent {m.parent or '-'}")
    print(f"  tokenizer {m.tokenized_info['tokenizer']} ({m.tokenized_info.get('backend')}), dtype {m.dtype}, "
          f"vocab {m.tokenized_info['vocab_size']}, format {m.format_name}")
    print(f"  boundary {m.boundary_tokens.describe()}")
    t = m.totals
    print(f"  totals: {t['documents']} documents, {t['tokens']} tokens, {t['shards']} shards, {t['bytes']} bytes; "
          f"{t['input_rows']} input rows, {t['null_texts']} null, {t['empty_texts']} empty")
    for split, entry in m.splits.items():
        print(f"  {split}: {entry.documents} documents, {entry.tokens} tokens in {len(entry.shards)} shards")
    _print_embeddings(m)
    report = inspect_version(shards, split=args.split or "train", samples=args.samples)
    if stats is not None:
        if _LENGTHS in report:
            # The report's length histogram is exact (from the document index); the statistics' one has
            # quarter-octave bins (p50 <= 2,047 where the median is 1,881). Printed once: the exact one.
            stats = {**stats, "splits": {}}
        print("\n".join(summary_lines(stats)))
        if card is not None:
            print(f"  card: {card}")
    print(report)
    return 0


_LENGTHS = "Document lengths in tokens"
"""How ``inspect_version``'s exact length histogram begins (absent where a version has no document index)."""


def cmd_diff(args: argparse.Namespace) -> int:
    from shardflow.diff import diff_versions, format_diff
    from shardflow.reader import open_version

    from shardflow.runtime.remote import is_remote_ref, remote_version

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")

    def manifest(ref: str) -> Any:
        if is_remote_ref(ref, catalog):  # on a bucket: its manifest alone is read, none of its shards
            return remote_version(ref, catalog=catalog)[1]
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        return open_version(ref, catalog=args.catalog).manifest

    print("\n".join(format_diff(diff_versions(manifest(args.ref_a), manifest(args.ref_b)), all_inputs=args.all)))
    return 0


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


def _size(n: int) -> str:
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
    print(f"{done} {r.ref} ({r.url}/): {r.objects} object{'s' if r.objects != 1 else ''} deleted, {_size(r.bytes)}")
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
    kept = f"; {_size(r.shared)} kept, hard-linked by other versions" if r.shared else ""
    done = "finished removing" if r.resumed else "removed"
    print(f"{done} {r.ref} ({r.directory}): {_size(r.freed)} freed{kept}")
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
        print(f"{verb} {g.url} ({g.objects} {unit}{'s' if g.objects != 1 else ''}, {_size(g.bytes)}): {g.why}")
    if not found:
        print(f"nothing to remove under {data_root.rstrip('/')} (uploads and unlisted versions written in the last "
              f"{hours:.12g} hours are kept)")
    else:
        n = len(found)
        print(f"{'would free' if args.dry_run else 'freed'} {_size(sum(g.bytes for g in found))} ({n} item{'s' if n != 1 else ''})")
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
        print(f"{verb} {g.path} ({_size(g.freed)}): {g.why}")
    if not found and not kept:
        print(f"nothing to remove under {default_data_root(args.data_root)}")
    elif found:
        n = len(found)
        print(f"{'would free' if args.dry_run else 'freed'} {_size(sum(g.freed for g in found))} "
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
    print(f"pushed {r.ref} to {r.url}: {r.uploaded} files uploaded ({_size(r.uploaded_bytes)}){copied}{skipped}; "
          f"listed in {r.catalog_file}")
    return 0
