"""The build's stages, declared once: name, core function, fan-out and retry class of each.

After ``plan_build`` (and under ``build_lock``) a build is these stages in
this order. ``build()`` runs them on a thread pool; the Prefect flow maps
each one to a task (``tasks/build.py``); both read this table, so the
sequence exists in one place::

    tokenize-unit  one job per work unit     ->  UnitResult     retried on transient I/O errors
    layout         one job                   ->  Layout         never retried (pure compute)
    stats-card     one job, beside the next  ->  CardResult     never retried (stats.json, the card's plots)
    write-shard    one job per shard         ->  ShardResult    retried
    validate-shard one job per shard         ->  ShardCheck     never retried (reads, checks)
    embed-fit      one job, with --embed-dim ->  EmbedFit       never retried (the PCA, fitted once)
    embed-shard    one job per shard         ->  EmbedShardResult  never retried (with --embed: its own files)
    embed          one job, with --embed     ->  EmbedResult    never retried (the parts as manifest sections)
    validate       one job (finalize)        ->  Manifest       never retried (the one manifest writer)
    publish        one job                   ->  "NAME@vN"      retried

A stage's function takes the plan and one job's arguments, is idempotent on
disk (it first looks for its own committed output), and returns small typed
metadata, never token arrays. A stage with ``joins`` runs in the background:
started in its place, beside the stages after it, without taking a worker slot,
and waited for before the stage it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from .card_stage import card_done, draw_card
from .check import shard_checked, validate_staged_shard
from .embed import embed_fit, embed_shard, embed_shard_done, embed_staged, fit_done
from .layout import make_layout
from .model import BuildPlan, Layout
from .publish import finalize, publish
from .tokenize import tokenize_unit, unit_done
from .write import shard_done, write_shard

__all__ = ["Stage", "STAGES", "stage", "Job"]

Job = tuple[Any, ...]
"""The arguments of one call of a stage's function, after the plan."""


def _one(plan: BuildPlan, done: dict[str, list[Any]]) -> list[Job]:
    return [()]


def _units(plan: BuildPlan, done: dict[str, list[Any]]) -> list[Job]:
    return [(u,) for u in range(len(plan.units))]


def _shards(plan: BuildPlan, done: dict[str, list[Any]]) -> list[Job]:
    layout: Layout = done["layout"][0]
    return list(layout.shard_jobs())


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One step of the pipeline after planning."""

    name: str
    """Also the Prefect task's name."""
    run: Callable[..., Any]
    """``run(plan, *job)``: the core function."""
    fan_out: Literal["one", "units", "shards"]
    """How many jobs: a single one, one per work unit, or one per shard of the layout."""
    retry: Literal["io", "never"]
    """``io``: a transient I/O error is retried (steps that move bytes); ``never``: compute and checks."""
    when: Callable[[BuildPlan], bool] = lambda plan: True
    label: Callable[[BuildPlan, Job], str]
    """How progress and the Prefect UI name one job."""
    done: Callable[..., Any] | None = None
    """``done(plan, *job)``: the job's result when it needs no work (committed already), else None; a few
    stats. ``run`` checks it first anyway; the flow asks before it spends a task run on the job."""
    joins: str | None = None
    """A background stage: started in its place in the table, run beside the stages after it (on a thread of
    its own, not a worker slot: a runner that has no background runs it in place), and waited for before
    the stage named here starts. Its result is that stage's to read, not the ones in between."""

    def jobs(self, plan: BuildPlan, done: dict[str, list[Any]]) -> Sequence[Job]:
        """This stage's jobs, given the results of the stages before it (by stage name)."""
        return {"one": _one, "units": _units, "shards": _shards}[self.fan_out](plan, done)

    def __call__(self, plan: BuildPlan, *job: Any) -> Any:
        return self.run(plan, *job)


STAGES: tuple[Stage, ...] = (
    Stage(
        name="tokenize-unit",
        run=tokenize_unit,
        done=unit_done,
        fan_out="units",
        retry="io",
        label=lambda plan, job: f"tokenize {plan.unit_label(job[0])}",
    ),
    Stage(name="layout", run=make_layout, fan_out="one", retry="never", label=lambda plan, job: f"layout {plan.config.name}"),
    # Everything the statistics and the card's plots show is known from the layout on: drawn while the
    # shards are written and validated (those jobs mostly release the GIL), not in finalize.
    Stage(
        name="stats-card",
        run=draw_card,
        done=card_done,
        fan_out="one",
        retry="never",
        when=lambda plan: plan.config.stats,
        joins="validate",
        label=lambda plan, job: f"stats-card {plan.config.name}",
    ),
    Stage(
        name="write-shard",
        run=write_shard,
        done=shard_done,
        fan_out="shards",
        retry="io",
        label=lambda plan, job: f"write {plan.config.name} {job[0]} shard {job[1]}",
    ),
    Stage(
        name="validate-shard",
        run=validate_staged_shard,
        done=shard_checked,
        fan_out="shards",
        retry="never",
        label=lambda plan, job: f"validate {plan.config.name} {job[0]} shard {job[1]}",
    ),
    # Embeddings: the PCA (with --embed-dim) fitted once, on a fixed sample, before any shard's job applies it;
    # then one job per shard (what grows with the corpus), each writing its own files; then the sections.
    Stage(
        name="embed-fit",
        run=embed_fit,
        done=fit_done,
        fan_out="one",
        retry="never",
        when=lambda plan: plan.config.embed is not None and plan.config.embed.embed_dim is not None,
        label=lambda plan, job: f"embed-fit {plan.config.name}",
    ),
    Stage(
        name="embed-shard",
        run=embed_shard,
        done=embed_shard_done,
        fan_out="shards",
        retry="never",
        when=lambda plan: plan.config.embed is not None,
        label=lambda plan, job: f"embed {plan.config.name} {job[0]} shard {job[1]}",
    ),
    Stage(
        name="embed",
        run=embed_staged,
        fan_out="one",
        retry="never",
        when=lambda plan: plan.config.embed is not None,
        label=lambda plan, job: f"embed {plan.config.name} sections",
    ),
    Stage(name="validate", run=finalize, fan_out="one", retry="never", label=lambda plan, job: f"validate {plan.config.name}"),
    Stage(name="publish", run=publish, fan_out="one", retry="io", label=lambda plan, job: f"publish {plan.config.name}"),
)


def stage(name: str) -> Stage:
    """The stage called ``name``."""
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no build stage {name!r}; the stages are {', '.join(s.name for s in STAGES)}")
