"""A realistic, non-repeating benchmark corpus: source and documentation files installed on this machine.

    python bench/realistic_corpus.py /tmp/bench/realistic                 # about 300 MB, 16 Parquet files
    python bench/realistic_corpus.py OUT --mb 200 --files 16 --dry-run    # only report what is available

``make_corpus.py`` composes documents from a ~3.5 MB pool of paragraphs, so a
tokenizer's pretoken cache hits almost every word of it; real corpora do not
repeat like that. This one takes one document per file from the Python
standard library of the interpreter running it, the site-packages of this
checkout's ``.venv`` and ``/usr/lib/python3*``: every ``.py .pyi .md .rst .txt
.c .h .json`` file of 1 byte to ``--max-file-kb`` (symbolic links skipped),
decoded as UTF-8 with ``errors="replace"``. Files with identical bytes count
once (the first path in sorted order). When more than ``--mb`` is available,
files are taken in the order of their contents' SHA-256 (a deterministic draw
spread over every root) until the corpus reaches ``--mb``; the documents are
then written sorted by path, in ``--files`` Parquet files of about equal size
(columns ``id`` = the path, ``text``, ``source`` = the root), in row groups of
about 4 MB of text, as ``make_corpus.py``'s 1024 rows (its documents are smaller),
so that work units can be cut as finely in both.

Same installed files, same bytes. ``corpus.json`` (written last) records the
roots, the counts and a digest of the (path, SHA-256) listing, so two machines
can tell whether they measured the same corpus; an ``OUT`` that already has it
is reused as it is.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = (".py", ".pyi", ".md", ".rst", ".txt", ".c", ".h", ".json")
ROW_GROUP_BYTES = 4_000_000
MANIFEST = "corpus.json"


def default_roots() -> list[Path]:
    """The interpreter's standard library, this checkout's ``.venv`` site-packages, ``/usr/lib/python3*``."""
    found = [sysconfig.get_paths()["stdlib"], *glob.glob(str(ROOT / ".venv" / "lib" / "python3*" / "site-packages"))]
    found += glob.glob("/usr/lib/python3*")
    roots: list[Path] = []
    for r in found:
        p = Path(r)
        # /usr/lib/python3 may be a link to /usr/lib/python3.X: walk each real directory once.
        if p.is_dir() and not p.is_symlink() and p.resolve() not in {q.resolve() for q in roots}:
            roots.append(p)
    return roots


def candidate_files(roots: list[Path], max_bytes: int) -> list[tuple[str, str]]:
    """``(path, root)`` of every file of the kinds above, 1 to ``max_bytes`` bytes, sorted by path."""
    out: dict[str, str] = {}
    for root in roots:
        for d, dirs, files in os.walk(root):  # followlinks=False: a linked directory is not walked twice
            dirs.sort()
            for f in files:
                if not f.endswith(EXTENSIONS):
                    continue
                p = os.path.join(d, f)
                if os.path.islink(p):
                    continue
                try:
                    size = os.path.getsize(p)
                except OSError:
                    continue
                if 0 < size <= max_bytes:
                    out.setdefault(p, str(root))
    return sorted(out.items())


def select(files: list[tuple[str, str]], target_bytes: int) -> tuple[list[tuple[str, str, str, int]], dict]:
    """The distinct files to use, as ``(path, root, sha256, bytes)`` sorted by path, and what was available."""
    distinct: list[tuple[str, str, str, int]] = []
    seen: set[str] = set()
    for path, root in files:
        try:
            data = Path(path).read_bytes()
        except OSError:  # unreadable (permissions): not part of the corpus
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        distinct.append((path, root, digest, len(data)))
    available = sum(n for *_, n in distinct)
    chosen = distinct
    if target_bytes and available > target_bytes:
        chosen, total = [], 0
        # A draw by content hash: deterministic, and spread over every root and package.
        for item in sorted(distinct, key=lambda x: x[2]):
            if total >= target_bytes:
                break
            chosen.append(item)
            total += item[3]
        chosen.sort()
    stats = {"candidate_files": len(files), "distinct_files": len(distinct), "available_bytes": available,
             "duplicates_skipped": len(files) - len(distinct)}
    return chosen, stats


def write_corpus(out: Path, chosen: list[tuple[str, str, str, int]], files: int) -> list[dict]:
    """Write ``chosen`` as ``files`` Parquet files of about equal bytes, in path order (temporary name, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    total = sum(n for *_, n in chosen)
    written, start, acc = [], 0, 0
    for f in range(files):
        # Cut where the running total passes (f + 1) / files of the bytes: contiguous, about equal parts.
        stop = start
        goal = total * (f + 1) / files
        while stop < len(chosen) and (acc + chosen[stop][3] <= goal or stop == start or f == files - 1):
            acc += chosen[stop][3]
            stop += 1
        part = chosen[start:stop]
        start = stop
        if not part:
            break
        texts = [Path(p).read_bytes().decode("utf-8", errors="replace") for p, *_ in part]
        table = pa.table({"id": [p for p, *_ in part], "text": texts, "source": [r for _, r, *_ in part]})
        path = out / f"part-{f:05d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        rows = max(1, min(1024, round(ROW_GROUP_BYTES * len(part) / sum(n for *_, n in part))))
        pq.write_table(table, tmp, row_group_size=rows)
        os.replace(tmp, path)
        written.append({"file": path.name, "documents": len(part), "bytes": sum(n for *_, n in part)})
    return written


def build_corpus(out: Path, *, mb: float = 300, files: int = 16, max_file_kb: int = 1024,
                 roots: list[Path] | None = None, dry_run: bool = False) -> dict:
    """Make (or reuse) the corpus in ``out``; returns its ``corpus.json`` record."""
    manifest = out / MANIFEST
    if manifest.is_file() and not dry_run:
        return json.loads(manifest.read_text(encoding="utf-8"))
    roots = roots or default_roots()
    candidates = candidate_files(roots, max_file_kb * 1024)
    chosen, stats = select(candidates, int(mb * 1e6))
    listing = hashlib.sha256("".join(f"{p}\0{h}\n" for p, _, h, _ in chosen).encode()).hexdigest()
    record = {
        "roots": [str(r) for r in roots],
        "extensions": list(EXTENSIONS),
        "max_file_bytes": max_file_kb * 1024,
        **stats,
        "target_bytes": int(mb * 1e6),
        "documents": len(chosen),
        "bytes": sum(n for *_, n in chosen),
        "listing_sha256": listing,
    }
    if dry_run:
        return record
    record["files"] = write_corpus(out, chosen, files)
    tmp = manifest.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, manifest)  # last: a corpus without it is incomplete and is made again
    return record


def describe(record: dict) -> str:
    return (f"{record['documents']:,} documents, {record['bytes'] / 1e6:.1f} MB "
            f"(of {record['available_bytes'] / 1e6:.1f} MB in {record['distinct_files']:,} distinct files; "
            f"{record['duplicates_skipped']:,} duplicates skipped), listing {record['listing_sha256'][:12]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=300, help="size to reach, in MB of text (0: everything available)")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--max-file-kb", type=int, default=1024, help="larger files are left out")
    ap.add_argument("--dry-run", action="store_true", help="only report what is available")
    args = ap.parse_args()
    if args.files < 1 or args.max_file_kb < 1 or args.mb < 0:
        sys.exit("--files and --max-file-kb must be positive, --mb at least 0")
    record = build_corpus(args.out, mb=args.mb, files=args.files, max_file_kb=args.max_file_kb, dry_run=args.dry_run)
    print(("available: " if args.dry_run else f"{args.out}: ") + describe(record))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
