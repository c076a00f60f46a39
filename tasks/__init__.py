"""Thin Prefect tasks around shardflow's core build steps.

Each task calls one function of ``shardflow.build`` and returns small,
serializable metadata (paths, counts, checksums), never token arrays: Prefect
hashes and may persist task inputs and results, and that must stay cheap.
``tasks.sources`` stages sources given as URLs (``s3://``, ``file://``).
"""

from .build import (
    attach_core_logs,
    embed_task,
    layout_task,
    plan_task,
    publish_task,
    tokenize_task,
    validate_task,
    write_shard_task,
)

__all__ = [
    "plan_task",
    "tokenize_task",
    "layout_task",
    "write_shard_task",
    "validate_task",
    "embed_task",
    "publish_task",
    "attach_core_logs",
]
