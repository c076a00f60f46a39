"""Printing a trainer target's settings for a published version (``build --target``, ``validate --for``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardflow.errors import ValidationError


def check_target(name: str, directory: Path, manifest: Any) -> None:
    """Refuse a version ``name``'s reader would not load as it is (another format, boundary, dtype or
    layout), with the reasons and what to build instead."""
    from shardflow.targets import get_target

    target = get_target(name)
    problems = target.version_problems(manifest)
    if problems:
        raise ValidationError(
            f"{directory}: {target.stack} cannot load {manifest.ref} as it is: {'; '.join(problems)}. "
            f"Rebuild it with --target {target.name}"
        )


def print_target_settings(name: str, directory: Path, manifest: Any = None) -> None:
    """Print what ``name``'s stack needs to train on the version in ``directory`` (checked first)."""
    from shardflow.manifest import read_manifest
    from shardflow.targets import get_target

    target = get_target(name)
    manifest = manifest if manifest is not None else read_manifest(directory)
    check_target(name, directory, manifest)
    print(f"settings for {target.stack} (--target {target.name}):")
    print(target.settings(manifest, Path(directory)))
