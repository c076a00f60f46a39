"""The build pipeline: corpora in, a validated and published version out, as stages any orchestrator can run.

    plan_build(config)       inputs, fingerprints, work units, build key, staging; published already?
    build_lock               one run per build; published meanwhile?
    STAGES, in order         tokenize-unit, layout, write-shard, [embed], validate, publish: each stage's jobs

``drive(config, executor)`` is that sequence, written once (``run``); the
executor only runs jobs: ``build(config)`` is ``drive`` on a thread pool,
``DaskExecutor`` runs them on a Dask cluster, and the Prefect flow in
``flows/`` runs them as task runs. The modules follow the data, each
owning one stage (see ``docs/ARCHITECTURE.md``):

    model        the typed hand-offs (BuildPlan, UnitResult, Layout, ShardResult, Reuse, ...)
    keys         the build key; a plan's published version (by its content key, too)
    staging      every path of the staging directory, its lock, cleanup after killed runs
    plan         planning                              incremental  reuse of the parent version
    tokenize     tokenizing one work unit              layout       splits and shards
    write        writing one shard                     assemble     assembling the manifest (pure)
    publish      finalize (validate) and publish        embed_stage  embedding stage and versions
    stages       the stage table                       run          the driver, executors, retries
    request      the build request, checked once       dask_executor  jobs on a Dask cluster, no Prefect
    handle       the plan as it travels to workers     collect_stats  a build's statistics
    check        a shard's checks as it is written, and their record (no build reads a shard back)

Every stage writes under ``<data_root>/<name>/.staging/<build key>/`` with
temporary names and ``os.replace``, and first checks whether its output
already exists, so a build killed at any point resumes where it stopped and
produces the same bytes.
"""

from __future__ import annotations

from .embed_stage import embed_staged
from .incremental import NO_REUSE_ENV
from .layout import make_layout
from .model import SPLITS, BuildPlan, BuildResult, EmbedResult, Layout, Reuse, ShardResult, UnitResult
from .plan import plan_build, token_dtype
from .publish import embed_version, finalize, publish, publish_out
from .staged import staged_manifest
from .handle import PlanHandle
from .request import BuildRequest
from .run import Events, Executor, ThreadExecutor, build, drive, retrying, run_request, run_stages
from .stages import STAGES, Stage, stage
from .staging import build_lock, load_plan
from .tokenize import tokenize_unit
from .write import shard_file_name, write_shard

__all__ = [
    "BuildPlan",
    "BuildResult",
    "UnitResult",
    "Layout",
    "ShardResult",
    "EmbedResult",
    "Reuse",
    "Stage",
    "STAGES",
    "SPLITS",
    "NO_REUSE_ENV",
    "BuildRequest",
    "run_request",
    "stage",
    "plan_build",
    "load_plan",
    "build_lock",
    "tokenize_unit",
    "make_layout",
    "write_shard",
    "embed_staged",
    "finalize",
    "staged_manifest",
    "publish",
    "publish_out",
    "embed_version",
    "build",
    "drive",
    "Events",
    "Executor",
    "ThreadExecutor",
    "PlanHandle",
    "run_stages",
    "retrying",
    "shard_file_name",
    "token_dtype",
]
