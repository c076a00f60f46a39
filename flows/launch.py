"""The command line's Prefect side: ``shardflow build`` as a flow run, and ``shardflow serve``'s deployment.

``build_with_prefect`` finds the server (``server.py``: the configured one, one
running on ``127.0.0.1:4200``, or a temporary one started before Prefect is
imported), runs the build in this process while a temporary server starts
(``build_until_answered``), then runs the ``build_dataset`` flow, which resumes
it. ``serve_deployment`` registers one dataset's deployment and serves its runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from shardflow.errors import ShardflowError

__all__ = ["build_with_prefect", "serve_deployment", "PREFECT_DEFAULTS"]

# Set before Prefect is imported (the user's own setting wins): the core's log lines go to Prefect's console and run logs.
PREFECT_DEFAULTS = {"PREFECT_LOGGING_EXTRA_LOGGERS": "shardflow"}


def build_with_prefect(request: Any, display: Any) -> Any:
    """``request`` as a ``build_dataset`` flow run, its progress on ``display``; the ``BuildResult``."""
    os.environ.update({**PREFECT_DEFAULTS, **os.environ})
    from shardflow.flows.server import build_until_answered, drain_prefect_workers, start_server

    # Before Prefect's import: the two overlap. (Dask's workers need a server they can reach: never a temporary one.)
    server = start_server() if request.runner == "threads" else None
    if server is not None and server.process is not None:
        build_until_answered(server, request)
    try:
        return _run_flow(request, display, server)
    finally:
        drain_prefect_workers()  # queued logs and events go out before the server (and this process) stops
        if server is not None:
            server.stop()


def _run_flow(request: Any, display: Any, server: Any) -> Any:
    from prefect.settings import get_current_settings

    from shardflow.cli.progress import listening
    from shardflow.flows.build import build_dataset, require_real_api
    from shardflow.flows.console import console_to, filtered_console, quiet_prefect_tracebacks, recorded_note

    if request.runner == "dask":
        require_real_api(request.runner, request.address)  # before any run
    quiet_prefect_tracebacks()
    with filtered_console() as console:
        try:
            with server.serve() if server else contextlib.nullcontext(None) as temporary, display, \
                    console_to(display.console), listening(display):
                # A temporary server: ours, or Prefect's own (no API URL) when we started none.
                console.hide_links = temporary if temporary is not None else not get_current_settings().api.url
                return build_dataset(config=request.config, workers=request.workers, data_root=request.data_root,
                                     catalog=request.catalog, runner=request.runner, address=request.address,
                                     scratch=request.scratch)
        finally:
            if console.hide_links and console.run_path:  # the server is gone: its link would be dead
                print(recorded_note(console.run_path), file=sys.stderr, flush=True)


def _schedules(cron: str | None, timezone: str | None) -> list[Any] | None:
    """``--cron`` and ``--timezone`` as Prefect's schedule; a bad one is a user error naming its option."""
    if cron is None:
        if timezone is not None:
            raise ShardflowError("--timezone is the timezone of --cron; give --cron 'MIN HOUR DOM MON DOW' too")
        return None
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron

    try:
        schedule = Cron(cron, timezone=timezone)
    except ValueError as exc:
        raise ShardflowError(f"--cron {cron!r}: {exc}; give five fields MIN HOUR DOM MON DOW, "
                             "e.g. '0 2 * * *' (02:00 daily)") from None
    try:  # Cron checks the cron only; the timezone is checked when the deployment is made
        CronSchedule(cron=cron, timezone=timezone)
    except ValueError:
        raise ShardflowError(f"--timezone {timezone!r}: not a timezone; give an IANA name, e.g. UTC or "
                             "Europe/Paris") from None
    return [schedule]


def serve_deployment(request: Any, *, cron: str | None, timezone: str | None, name: str, limit: int | None,
                     dry_run: bool) -> int:
    """Register ``request`` as a deployment of ``build_dataset`` named ``name`` and serve its runs (``dry_run``:
    print it as JSON instead)."""
    if not dry_run:
        os.environ.update({**PREFECT_DEFAULTS, **os.environ})  # before Prefect's import
    schedules = _schedules(cron, timezone)
    from shardflow.flows.build import build_dataset, dataset_tag
    from shardflow.tasks.build import TAGS

    config = request.config
    deployment = build_dataset.to_deployment(
        name=name,
        schedules=schedules,
        parameters={"config": config.to_dict(), "workers": request.workers, "data_root": request.data_root,
                    "catalog": request.catalog, "runner": request.runner, "address": request.address,
                    "scratch": request.scratch},
        tags=[*TAGS, dataset_tag(config.name)],
        description=f"Build the {config.name} dataset",
    )
    full_name = f"{deployment.flow_name}/{deployment.name}"
    if dry_run:
        print(json.dumps({"deployment": full_name, "cron": cron, "timezone": timezone, "tags": deployment.tags,
                          "parameters": deployment.parameters, "description": deployment.description}, indent=2))
        return 0
    from prefect import serve

    when = f"cron {cron!r} ({timezone or 'UTC'})" if cron else "no schedule (runs start by hand)"
    print(f"serving {full_name}: {config.name} from {', '.join(config.sources)}, {when}", flush=True)
    try:
        serve(deployment, limit=limit)
    finally:
        from shardflow.flows.server import drain_prefect_workers

        drain_prefect_workers()
    return 0
