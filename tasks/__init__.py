"""Thin Prefect tasks around shardflow's core build steps: ``plan_task``, and one task per stage (``STAGE_TASKS``).

Each task calls one function of ``shardflow.pipeline`` and returns small,
serializable metadata (paths, counts, checksums), never token arrays.
"""

from .build import STAGE_TASKS, attach_core_logs, plan_task

__all__ = ["plan_task", "STAGE_TASKS", "attach_core_logs"]
