"""``PlanHandle``: the plan as it travels to a job on another process, by its staging directory when it can.

A plan grows with the corpus (one entry per input and per unit, about 200
bytes each); every job of a large build carrying all of it would move
gigabytes through a scheduler. When the staging directory's ``plan.json`` is
this plan (as ``build_lock`` hands it over), a handle pickles as that
directory's path, and a worker reads ``plan.json`` from the shared data root
once per process. An object of a plain class is also one that Prefect does
not walk looking for futures at every submission.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ShardflowError
from .model import BuildPlan
from .staging import load_plan

__all__ = ["PlanHandle"]


@functools.lru_cache(maxsize=4)
def _plan_at(staging: str, stamp: tuple[int, int]) -> BuildPlan:
    return load_plan(staging)


def _plan_on_disk(staging: str) -> BuildPlan:
    """The plan in ``staging``'s ``plan.json``, read once per process (per version of the file)."""
    st = (Path(staging) / "plan.json").stat()
    return _plan_at(staging, (st.st_mtime_ns, st.st_size))


class PlanHandle:
    """The plan, passed to jobs on other processes as an opaque object (``handle.plan``).

    Unpickling never touches the filesystem: a worker that cannot see the staging directory fails the
    job that reads ``handle.plan`` (one error, naming the path), never the connection that brought it.
    """

    __slots__ = ("_plan", "_staging", "on_disk")

    def __init__(self, plan: BuildPlan) -> None:
        self._plan: BuildPlan | None = plan
        self._staging = plan.staging
        try:
            on_disk = dataclasses.replace(load_plan(plan.staging), existing=plan.existing)
        except (OSError, ValueError, ShardflowError):
            on_disk = None
        self.on_disk = on_disk == plan

    @property
    def plan(self) -> BuildPlan:
        if self._plan is None:
            try:
                self._plan = _plan_on_disk(self._staging)
            except FileNotFoundError:
                raise ConfigError(f"{self._staging}: this worker cannot see the build's staging directory; a build "
                                  "with a local --data-root needs storage every worker mounts at the same path") from None
        return self._plan

    def __getstate__(self) -> Any:
        return ("staging", self._staging) if self.on_disk else self.plan

    def __setstate__(self, state: Any) -> None:
        self.on_disk = isinstance(state, tuple)
        self._plan = None if self.on_disk else state
        self._staging = state[1] if self.on_disk else state.staging

    def __repr__(self) -> str:
        return f"PlanHandle({self._staging!r})"
