"""A build request: what to build (``BuildConfig``) and where and how it runs, checked once, when it is made.

The command line (``build``, ``serve``), the ``build_dataset`` flow and
``build()`` each make one; nothing after that checks workers, the runner, its
address or the data root and catalog again. ``places`` resolves a build to a
bucket (``--data-root s3://... --catalog s3://...``) once; ``run_request``
(``pipeline/run.py``) syncs its catalog once, in the process that runs the build.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..config import BuildConfig
from ..errors import ConfigError

__all__ = ["BuildRequest", "RUNNERS"]

RUNNERS = ("threads", "dask")


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """Everything a build is asked to do. Its checks run when it is made (``ConfigError``, naming the option)."""

    config: BuildConfig
    workers: int = 2
    """Jobs run at once (the bound on memory: workers x batch size)."""
    runner: str = "threads"
    """``threads`` in this process, or ``dask``: the cluster at ``address``."""
    address: str | None = None
    data_root: str | None = None
    """Where versions are written (default ``$SHARDFLOW_DATA_ROOT`` or ``./data``); ``s3://`` with ``catalog`` on it."""
    catalog: str | None = None
    scratch: str | None = None
    """For a build to a bucket: the local directory it is built in before the push."""

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, not {self.workers}")
        if self.runner not in RUNNERS:
            raise ConfigError(f"--runner {self.runner}: unknown; use one of {', '.join(RUNNERS)}")
        if self.runner == "dask" and not self.address:
            raise ConfigError("--runner dask needs --address tcp://HOST:PORT, the address of a running Dask scheduler")
        if self.runner != "dask" and self.address:
            raise ConfigError("--address is for --runner dask; the threads runner runs in this process")
        self.places  # a bucket's URLs checked now: one bucket, plain prefixes, both or neither on it

    @cached_property
    def places(self) -> Any:
        """The ``BucketPlaces`` of a build to a bucket (the options, else the environment), or None."""
        from ..bucket.build import bucket_places

        return bucket_places(self.data_root or os.environ.get("SHARDFLOW_DATA_ROOT"),
                             self.catalog or os.environ.get("SHARDFLOW_CATALOG"), self.scratch)

    @property
    def local(self) -> tuple[str | None, str | None]:
        """The data root and catalog the build writes: the options, or a build to a bucket's scratch mirror."""
        places = self.places
        return (self.data_root, self.catalog) if places is None else (str(places.data_root), str(places.catalog))
