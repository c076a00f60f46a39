"""The build's stages, declared once: name, core function, fan-out and retry class of each.

After ``plan_build`` (and under ``build_lock``) a build is the stages of ``STAGES``, in order:
tokenize-unit, layout, stats-card, write-shard, embed-fit, embed-shard, embed, validate, publish
(docs/ARCHITECTURE.md). No stage reads a shard back to check it: each is checked as it is written
(``check.py``), and ``validate`` compares the records with the files' identities. ``build()`` runs them on a thread pool and the Prefect
flow maps each one to a task (``tasks/build.py``); both read this table, so the sequence exists in
one place.

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
from .embed_stage import embed_fit, embed_shard, embed_shard_done, embed_staged, fit_done
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
    verb: str = ""
    """How progress and the Prefect UI name its jobs (``label``): the stage's name where empty."""
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

    def label(self, plan: BuildPlan, job: Job) -> str:
        """One job's name in progress and the Prefect UI: ``write NAME train shard 3``, ``tokenize part-0.parquet``."""
        verb, name = self.verb or self.name, plan.config.name
        if self.fan_out == "units":
            return f"{verb} {plan.unit_label(job[0])}"
        return f"{verb} {name} {job[0]} shard {job[1]}" if self.fan_out == "shards" else f"{verb} {name}"


def _embeds(plan: BuildPlan) -> bool:
    return plan.config.embed is not None


STAGES: tuple[Stage, ...] = (
    Stage(name="tokenize-unit", run=tokenize_unit, done=unit_done, fan_out="units", retry="io", verb="tokenize"),
    Stage(name="layout", run=make_layout, fan_out="one", retry="never"),
    # Everything the statistics and the card's plots show is known from the layout on: drawn while the
    # shards are written (those jobs mostly release the GIL), not in finalize.
    Stage(name="stats-card", run=draw_card, done=card_done, fan_out="one", retry="never",
          when=lambda plan: plan.config.stats, joins="validate"),
    # Each shard checked as it is written (a placed one: its piece, when its tokenize job wrote it): none is read back.
    Stage(name="write-shard", run=write_shard, done=shard_done, fan_out="shards", retry="io", verb="write"),
    # Embeddings: the PCA (with --embed-dim) fitted once, on a fixed sample, before any shard's job applies it;
    # then one job per shard (what grows with the corpus), each writing its own files; then the sections.
    Stage(name="embed-fit", run=embed_fit, done=fit_done, fan_out="one", retry="never",
          when=lambda plan: _embeds(plan) and plan.config.embed.embed_dim is not None),
    Stage(name="embed-shard", run=embed_shard, done=embed_shard_done, fan_out="shards", retry="never", when=_embeds,
          verb="embed"),
    Stage(name="embed", run=embed_staged, fan_out="one", retry="never", when=_embeds, verb="embed sections of"),
    Stage(name="validate", run=finalize, fan_out="one", retry="never"),
    Stage(name="publish", run=publish, fan_out="one", retry="io"),
)


def stage(name: str) -> Stage:
    """The stage called ``name``."""
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no build stage {name!r}; the stages are {', '.join(s.name for s in STAGES)}")
