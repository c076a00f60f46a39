"""Scheduled builds: a schedules file (or command-line options) to Prefect deployments of ``build_dataset``.

``shardflow serve schedules.yaml`` registers one deployment per dataset, each
with its cron schedule and build parameters, and serves them: this process
polls the Prefect server and runs their flow runs (scheduled ones, and those
started by hand with ``prefect deployment run build-dataset/<deployment>`` or
the UI's "Run" button). A schedules file::

    defaults:                      # optional, merged into every dataset
      data_root: /shared/shardflow/data
      catalog: /shared/shardflow/manifests
      workers: 4
      timezone: UTC
    datasets:
      - name: wiki                 # the dataset; also the deployment name unless `deployment:` is given
        sources: [/shared/corpora/wiki/]
        cron: "0 2 * * *"          # nightly at 02:00
        options:                   # any build option (BuildConfig field)
          tokenizer: cl100k_base
          val_fraction: 0.001
          boundary: both           # bos (default), eos, or both: BOS + ids + EOS (--bos --eos)
          bos_token: "<|fim_prefix|>"   # text or id (--bos-token); default: the tokenizer's own
          eos_token: 100259             # (--eos-token)
          # target: megatron        # a trainer target (--target); options given here must agree with it
      - name: code
        sources: ["s3://corpora/code/*.parquet"]
        cron: "30 3 * * 0"         # Sundays 03:30
        runner: dask
        address: tcp://dask-scheduler:8786
        tags: [weekly]
        paused: false

A scheduled build over a source directory is incremental: when no input file
changed, the run finds the identical published version and publishes nothing
(its summary says so); when files were added or changed, only those are
tokenized (the core reuses the other files' tokens from the previous version)
and it publishes the next version, whose manifest names the previous one as
parent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shardflow.config import BuildConfig
from shardflow.errors import ConfigError

from shardflow.tasks.sources import is_url

__all__ = ["ScheduledBuild", "load_schedules", "to_deployments", "DATASET_KEYS"]

DATASET_KEYS = frozenset(
    {"name", "sources", "cron", "timezone", "options", "workers", "data_root", "catalog", "runner", "address",
     "deployment", "tags", "paused", "description"}
)


@dataclass(frozen=True, kw_only=True)
class ScheduledBuild:
    """One deployment of ``build_dataset``: a dataset, its schedule, and the flow's parameters."""

    deployment: str
    config: BuildConfig
    cron: str | None = None
    timezone: str | None = None
    workers: int = 2
    data_root: str | None = None
    catalog: str | None = None
    runner: str = "threads"
    address: str | None = None
    tags: tuple[str, ...] = ()
    paused: bool = False
    description: str = ""

    def parameters(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "workers": self.workers,
            "data_root": self.data_root,
            "catalog": self.catalog,
            "runner": self.runner,
            "address": self.address,
        }

    def all_tags(self) -> list[str]:
        """``shardflow``, ``dataset:<name>``, then the file's own tags."""
        from shardflow.tasks.build import TAGS

        tags = [*TAGS, f"dataset:{self.config.name}", *self.tags]
        return list(dict.fromkeys(tags))

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": f"build-dataset/{self.deployment}",
            "cron": self.cron,
            "timezone": self.timezone,
            "tags": self.all_tags(),
            "paused": self.paused,
            "parameters": self.parameters(),
        }


def _abs(path: str | None, base: Path) -> str | None:
    """Paths in a schedules file are relative to the file; served runs may start elsewhere."""
    if path is None or is_url(path):
        return path
    p = Path(os.path.expanduser(path))
    return str(p if p.is_absolute() else (base / p).resolve())


def _one(entry: Any, defaults: dict[str, Any], base: Path, where: str) -> ScheduledBuild:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each dataset is a mapping with at least 'name', 'sources' and 'cron'")
    merged = {**defaults, **entry}
    unknown = sorted(set(merged) - DATASET_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(unknown)}; the keys are {', '.join(sorted(DATASET_KEYS))}")
    for key in ("name", "sources"):
        if not merged.get(key):
            raise ConfigError(f"{where}: {key!r} is required")
    sources = merged["sources"]
    if isinstance(sources, str):
        sources = [sources]
    options = {**(defaults.get("options") or {}), **(entry.get("options") or {})}
    if "name" in options or "sources" in options:
        raise ConfigError(f"{where}: give 'name' and 'sources' at the dataset level, not under 'options'")
    try:
        if options.get("target") is not None:  # options written in the file must agree with the target
            from shardflow.targets import get_target

            get_target(str(options["target"])).check_given({k: options.get(k) for k in ("format", "boundary", "shard_tokens")})
        config = BuildConfig(
            name=merged["name"], sources=tuple(_abs(str(s), base) or "" for s in sources), **options
        )
    except TypeError as exc:
        raise ConfigError(f"{where}: bad build option ({exc})") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    runner = merged.get("runner", "threads")
    if runner not in ("threads", "dask"):
        raise ConfigError(f"{where}: runner must be 'threads' or 'dask', not {runner!r}")
    if runner == "dask" and not merged.get("address"):
        raise ConfigError(f"{where}: runner 'dask' needs 'address: tcp://HOST:PORT'")
    cron = merged.get("cron")
    if cron is not None:
        _check_cron(str(cron), merged.get("timezone"), where)
    workers = merged.get("workers", 2)
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{where}: workers must be a positive integer, not {workers!r}")
    return ScheduledBuild(
        deployment=str(merged.get("deployment") or config.name),
        config=config,
        cron=str(cron) if cron is not None else None,
        timezone=merged.get("timezone"),
        workers=workers,
        data_root=_abs(merged.get("data_root"), base),
        catalog=_abs(merged.get("catalog"), base),
        runner=runner,
        address=merged.get("address"),
        tags=tuple(str(t) for t in merged.get("tags") or ()),
        paused=bool(merged.get("paused", False)),
        description=str(merged.get("description") or f"Build the {config.name} dataset"),
    )


def _check_cron(cron: str, timezone: str | None, where: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        first = errors()[0]["msg"].removeprefix("Value error, ") if callable(errors) else str(exc)
        raise ConfigError(
            f"{where}: bad schedule cron={cron!r} timezone={timezone!r} ({first}); "
            "e.g. cron '0 2 * * *' (02:00 daily) and timezone 'UTC' or 'Europe/Paris'"
        ) from None


def load_schedules(path: str | os.PathLike[str]) -> list[ScheduledBuild]:
    """Parse and validate a schedules file; every error names the file and the dataset."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such schedules file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), list) or not doc["datasets"]:
        raise ConfigError(f"{path}: expected a mapping with a non-empty 'datasets' list")
    unknown = sorted(set(doc) - {"defaults", "datasets"})
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {', '.join(unknown)}; use 'defaults' and 'datasets'")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: 'defaults' must be a mapping")
    base = path.resolve().parent
    builds = [
        _one(entry, defaults, base, f"{path}, dataset {i + 1}" + (f" ({entry.get('name')})" if isinstance(entry, dict) else ""))
        for i, entry in enumerate(doc["datasets"])
    ]
    seen: set[str] = set()
    for b in builds:
        if b.deployment in seen:
            raise ConfigError(f"{path}: two datasets deploy as {b.deployment!r}; give one a distinct 'deployment:'")
        seen.add(b.deployment)
    return builds


def to_deployments(builds: list[ScheduledBuild]) -> list[Any]:
    """``RunnerDeployment`` objects of ``build_dataset``, ready for ``prefect.serve``."""
    from prefect.schedules import Cron

    from shardflow.flows.build import build_dataset

    deployments = []
    for b in builds:
        deployments.append(
            build_dataset.to_deployment(
                name=b.deployment,
                schedules=[Cron(b.cron, timezone=b.timezone)] if b.cron else None,
                parameters=b.parameters(),
                tags=b.all_tags(),
                description=b.description,
                paused=b.paused,
            )
        )
    return deployments
