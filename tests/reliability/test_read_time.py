"""Bad data at read time: ``shardflow validate`` and the runtime name every kind of damage.

A published version is copied (data root and catalog together), damaged one
way, and then read three ways: ``shardflow validate REF`` (exit 2, one message
naming the file, no traceback), ``open_version`` / the runtime's ``open_shards``
(a ``ShardflowError`` naming the file; for damage to one shard or index, when
that file is first used: opening makes no filesystem call per shard, issue 43)
and, for damage only checksums can see, the same with ``verify=True``.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml

from support.builds import build_in
from support.cli import run_main
from support.corpus import small_vocab
from support.paths import SRC_DIR
from shardflow.errors import ManifestError, ShardflowError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.runtime import open_shards
from shardflow.shardset import ShardSet

NAME = "rd"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("readtime")
    from support.paths import SAMPLE

    build_in(base / "root", SAMPLE, NAME, dict(tokenizer=str(small_vocab(base)), shard_tokens=30_000))
    return base / "root"


@pytest.fixture
def root(published: Path, tmp_path: Path) -> Path:
    """A private copy of the data root and catalog (catalog paths are relative, so it resolves)."""
    dest = tmp_path / "root"
    shutil.copytree(published, dest)
    return dest


def vdir(root: Path) -> Path:
    return root / "data" / NAME / "v1"


def shard(root: Path, k: int = 1) -> tuple[Path, Path]:
    entry = read_manifest(vdir(root)).splits["train"].shards[k]
    return vdir(root) / entry.file, vdir(root) / entry.index.file


def validate_cli(root: Path, ref: str | None = None) -> tuple[int, str]:
    rc, _, err = run_main("validate", ref or f"{NAME}@v1", "--catalog", str(root / "catalog"))
    return rc, err


def assert_detected(
    root: Path, pattern: str, *, needs_checksums: bool = False, first_use: Callable[[ShardSet], object] | None = None
) -> None:
    """``first_use(shards)``: damage to a file that opening does not touch, seen when that use of the opened split's
    shards first reads it."""
    rc, err = validate_cli(root)
    assert rc == 2 and "Traceback" not in err, err
    assert err.startswith("shardflow: error: "), err
    assert re.search(pattern, err), f"{pattern!r} not in {err!r}"
    ref = f"{NAME}@v1"
    if needs_checksums:
        # Opening trusts sizes; verifying reads every byte.
        open_version(ref, catalog=root / "catalog")
        with pytest.raises(ValidationError, match=pattern):
            open_version(ref, catalog=root / "catalog", verify=True)
        with pytest.raises(ValidationError, match=pattern):
            open_shards(ref, catalog=root / "catalog", verify=True)
    elif first_use is not None:
        for shards in (open_version(ref, catalog=root / "catalog").split("train").shards,
                       open_shards(ref, catalog=root / "catalog")):
            with pytest.raises(ShardflowError, match=pattern):
                first_use(shards)
    else:
        with pytest.raises(ShardflowError, match=pattern):
            open_version(ref, catalog=root / "catalog")
        with pytest.raises(ShardflowError, match=pattern):
            open_shards(ref, catalog=root / "catalog")


def test_the_intact_version_validates(root):
    rc, _ = validate_cli(root)
    assert rc == 0


def test_truncated_shard(root):
    path, _ = shard(root)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    assert_detected(root, rf"{re.escape(str(path))}: \d+ bytes, but the manifest says \d+.*truncated",
                    first_use=lambda s: s.shard(1))


def test_changed_byte(root):
    path, _ = shard(root)
    data = bytearray(path.read_bytes())
    data[5000] ^= 0x01
    path.write_bytes(bytes(data))
    assert_detected(root, rf"{re.escape(str(path))}: SHA-256 .* does not match the manifest", needs_checksums=True)


def test_missing_index(root):
    _, idx = shard(root)
    idx.unlink()
    assert_detected(root, rf"{re.escape(str(idx))}: (the \.bos\.idx index .* is missing|missing)",
                    first_use=lambda s: s.doc_starts(1))


def test_wrong_index_of_the_same_size(root):
    path, idx = shard(root)
    starts = np.fromfile(idx, dtype="<i4")
    assert len(starts) >= 2
    starts[1] += 1  # still ascending and in range, but not a document start
    starts.tofile(idx)
    assert_detected(root, rf"{re.escape(str(idx))}: SHA-256 does not match the manifest", needs_checksums=True)
    rc, err = validate_cli(root)
    assert "which is not a document start" in err


def test_index_of_another_size(root):
    _, idx = shard(root)
    idx.write_bytes(idx.read_bytes()[:-4])
    assert_detected(root, rf"{re.escape(str(idx))}: \d+ bytes, but the manifest says \d+", first_use=lambda s: s.doc_starts(1))


def _edit_manifest(root: Path, edit) -> Path:
    path = vdir(root) / "metadata.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_edited_manifest_is_caught_by_the_catalog_checksum(root):
    # An edit that agrees with every file: only the checksum the catalog recorded can tell.
    path = _edit_manifest(root, lambda d: d["config"].update(seed=99))
    assert_detected(root, rf"{re.escape(str(path))}: the manifest was changed after {NAME}@v1 was published")


def test_shard_and_manifest_changed_together(root):
    import hashlib

    spath, _ = shard(root)
    data = bytearray(spath.read_bytes())
    data[5000] ^= 0x01
    spath.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    _edit_manifest(root, lambda d: d["splits"]["train"]["shards"][1].update(sha256=digest))
    assert_detected(root, r"metadata\.yaml: the manifest was changed after")


def test_edited_counts(root):
    import hashlib

    def edit(d):
        d["splits"]["train"]["shards"][0]["tokens"] += 1

    _edit_manifest(root, edit)
    rc, err = validate_cli(root)
    assert rc == 2 and "the header says" in err and "the manifest says" in err
    # Also when the catalog's checksum is updated to match: the files disagree with it.
    cat = root / "catalog" / f"{NAME}.yaml"
    data = yaml.safe_load(cat.read_text())
    data["versions"][0]["manifest_sha256"] = hashlib.sha256((vdir(root) / "metadata.yaml").read_bytes()).hexdigest()
    cat.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, err = validate_cli(root)
    assert rc == 2 and "the header says" in err and "manifest says" in err


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "sub/dir/x.bin", "..\\x.bin"])
def test_shard_path_escaping_the_version_directory(root, name):
    _edit_manifest(root, lambda d: d["splits"]["train"]["shards"][0].update(file=name))
    pattern = rf"file {re.escape(repr(name))} escapes the version directory; shard paths must be plain file names or SPLIT/FILE"
    rc, err = validate_cli(root)
    assert rc == 2 and re.search(pattern, err) and "Traceback" not in err, err
    with pytest.raises(ManifestError, match=pattern):
        open_version(vdir(root))
    with pytest.raises(ManifestError, match=pattern):
        open_shards(str(vdir(root)))


def test_unknown_schema_version(root):
    _edit_manifest(root, lambda d: d.update(schema_version=5))
    pattern = r"unknown manifest schema_version 5; this shardflow reads schema_version 1, 2, 3 and 4\. Upgrade shardflow"
    rc, err = validate_cli(root)
    assert rc == 2 and re.search(pattern, err), err
    with pytest.raises(ManifestError, match=pattern):
        open_version(vdir(root))


def test_yaml_is_read_with_a_safe_loader(root, tmp_path):
    marker = tmp_path / "pwned"
    (vdir(root) / "metadata.yaml").write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    rc, err = validate_cli(root)
    assert rc == 2 and "not valid YAML" in err
    with pytest.raises(ManifestError, match="not valid YAML"):
        open_version(vdir(root))
    cat = root / "catalog" / f"{NAME}.yaml"
    cat.write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    rc, err = validate_cli(root)
    assert rc == 2 and "not valid YAML" in err
    assert not marker.exists()


_SAFE_LOADERS = {"SafeLoader", "CSafeLoader"}


def _loader_names(node: ast.AST, text: str, assigned: dict[str, str]) -> set[str]:
    """The YAML loader classes an expression can name (a variable: what it is assigned)."""
    segment = assigned.get(node.id, "") if isinstance(node, ast.Name) else ast.get_source_segment(text, node) or ""
    return set(re.findall(r"\b(C?(?:Safe|Full|Unsafe|Base)?Loader)\b", segment))


def _calls(tree: ast.AST, text: str) -> list[tuple[int, str]]:
    assigned = {
        t.id: ast.get_source_segment(text, n.value) or ""
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            kwargs = {k.arg: k.value for k in node.keywords}
            if owner == "yaml" and name in ("unsafe_load", "full_load", "unsafe_load_all", "full_load_all"):
                found.append((node.lineno, f"yaml.{name}"))
            if owner == "yaml" and name in ("load", "load_all"):
                loader = kwargs.get("Loader", node.args[1] if len(node.args) > 1 else None)
                names = _loader_names(loader, text, assigned) if loader is not None else set()
                if not names or not names <= _SAFE_LOADERS:
                    found.append((node.lineno, f"yaml.{name} with loader {sorted(names) or 'unknown'}"))
            if name in ("load", "loads") and owner in ("pickle", "cPickle", "dill", "joblib", "torch"):
                found.append((node.lineno, f"{owner}.{name}"))
            allow = kwargs.get("allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                found.append((node.lineno, "allow_pickle=True"))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] in ("pickle", "cPickle", "dill", "shelve", "marshal") for m in mods):
                found.append((node.lineno, f"import {mods}"))
    return found


@pytest.mark.slow
def test_nothing_on_the_read_path_unpickles_or_loads_unsafe_yaml():
    offenders = []
    for path in sorted(SRC_DIR.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for lineno, what in _calls(ast.parse(text), text):
            offenders.append(f"{path.relative_to(SRC_DIR.parent)}:{lineno}: {what}")
    assert not offenders, "\n".join(offenders)
