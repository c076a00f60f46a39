"""Trainer targets: one module per training stack whose own reader loads a version as it is.

``--target NAME`` (``BuildConfig.target``) sets the format, the boundary
placement, the dtype rule and the file layout that stack's reader needs,
refuses what it cannot read, and ``settings`` prints what to paste into its
configuration. See ``targets.base.Target``.
"""

from __future__ import annotations

from ..errors import ConfigError
from . import kempnerforge, megatron, modded_nanogpt, nanogpt, nemo, olmo_core
from .base import Target, default_shard_path

__all__ = ["Target", "TARGETS", "get_target", "default_shard_path", "shard_path", "file_pattern"]

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        modded_nanogpt.TARGET,
        nanogpt.TARGET,
        nemo.TARGET,
        kempnerforge.TARGET,
        olmo_core.TARGET,
        megatron.TARGET,
    )
}


def get_target(name: str) -> Target:
    """The target called ``name``; a ``ConfigError`` lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ConfigError(f"unknown trainer target {name!r}; use one of {', '.join(TARGETS)}") from None


def shard_path(target: str | None, name: str, split: str, index: int, extension: str) -> str:
    """Where shard ``index`` of ``split`` goes in a new version, relative to its directory."""
    if target is None:
        return default_shard_path(name, split, index, extension)
    return get_target(target).file_name(name, split, index, extension)


def file_pattern(target: str | None, name: str, extension: str) -> str:
    """The glob of a split's shards that the manifest records (``{split}`` stands for the split)."""
    if target is not None and get_target(target).one_file_per_split:
        return f"{{split}}.{extension}"
    return f"{{split}}/{name}_{{split}}_*.{extension}"
