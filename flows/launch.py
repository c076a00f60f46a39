"""The command line's Prefect side: ``shardflow build`` as a flow run, and ``shardflow serve``'s deployment.

``build_with_prefect`` finds the server (``server.py``: the configured one, one
running on ``127.0.0.1:4200``, or a temporary one started before Prefect is
imported), runs the build in this process while a temporary server starts
(``build_until_answered``), then runs the ``build_dataset`` flow, which resumes
it. A temporary server still silent after its startup timeout is stopped and
the build finished here, without Prefect, in one line's notice; a server that
stops answering during the flow ends the build in one error line (``server.py``).
``serve_deployment`` registers one dataset's deployment and serves its runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from shardflow.errors import ShardflowError

__all__ = ["build_with_prefect", "serve_deployment", "PREFECT_DEFAULTS"]

# Set before Prefect is imported (the user's own setting wins): the core's log lines go to Prefect's console and run
# logs; Prefect's client gives up on a server that is gone after 3 retries 2, 4 and 8 s apart, and on a request
# unanswered after 30 s (its defaults, 5 retries up to 32 s apart and 60 s, kept a build minutes per task run on a
# server that had gone; flows/server.py's watch ends the build anyway).
PREFECT_DEFAULTS = {"PREFECT_LOGGING_EXTRA_LOGGERS": "shardflow", "PREFECT_CLIENT_MAX_RETRIES": "3",
                    "PREFECT_API_REQUEST_TIMEOUT": "30"}


def build_with_prefect(request: Any, display: Any) -> Any:
    """``request`` as a ``build_dataset`` flow run, its progress on ``display``; the ``BuildResult``.

    A temporary server that has not answered within its startup timeout once only validate and publish are left
    (``ServerSilent``): stopped, and the build finished in this process, the same bytes, with one line saying so. A
    server that stops answering during the run: ``ServerGone``, one line (``flows/server.py``).
    """
    os.environ.update({**PREFECT_DEFAULTS, **os.environ})
    from shardflow.flows.server import (
        ServerGone, ServerSilent, build_until_answered, drain_prefect_workers, ends_with_build, gone_server,
        silent_server, start_server,
    )

    # Before Prefect's import: the two overlap. (Dask's workers need a server they can reach: never a temporary one.)
    server = start_server() if request.runner == "threads" else None
    try:
        with ends_with_build(), display:  # progress from the first job: while the server starts, then the flow's
            if server is not None and server.process is not None:
                build_until_answered(server, request, display)
            seen: list[Any] = []  # the run's progress: whether it published before its server went
            try:
                return _run_flow(request, display, server, seen)
            except ServerSilent as silent:
                print(f"shardflow: {silent}: stopped it, and finished the build in this process without Prefect "
                      "(no flow run is recorded)", file=sys.stderr, flush=True)
                return _finish_here(request, display)
            except Exception as exc:
                # Gone: the watch said so, or Prefect's calls gave up first while it polled in vain; or (a server
                # this build did not start) it does not answer now.
                watched = gone_server() or (None if isinstance(exc, ShardflowError) else silent_server())
                url = watched or _unanswering(exc, server)
                if url is None:
                    raise
                published = _published(request, seen)
                if published is None:
                    raise ServerGone(url, stopped=watched is not None) from None
                print(f"shardflow: the Prefect server at {url.removesuffix('/api')} stopped answering after "
                      f"{published.ref} was done; the end of its run is not recorded there", file=sys.stderr, flush=True)
                return published
    finally:
        if gone_server() is None and silent_server() is None:
            drain_prefect_workers()  # queued logs and events go out before the server (and this process) stops
        if server is not None:
            server.stop()


def _unanswering(exc: Exception, server: Any) -> str | None:
    """The configured server's API URL if ``exc`` (not a user error) came with that server not answering now."""
    if isinstance(exc, ShardflowError) or (server is not None and server.process is not None):
        return None  # a temporary server is stopped by now whatever happened: only the watch can tell
    url = server.url if server is not None else None
    if url is None and "prefect.settings" in sys.modules:
        from prefect.settings import get_current_settings

        url = get_current_settings().api.url
    from shardflow.flows.server import answers

    return str(url) if url and not answers(str(url), timeout=5) else None


class _Ends:
    """A progress listener that keeps the run's ``finish`` (validate and publish) and ``done`` events in ``seen``."""

    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    def append(self, event: Any) -> None:
        if event.phase in ("finish", "done"):
            self.seen.append(event)


def _published(request: Any, seen: list[Any]) -> Any:
    """The ``BuildResult`` of a run whose progress said it was done (None: it was not), from that progress."""
    from shardflow.catalog import Catalog
    from shardflow.pipeline.model import BuildResult

    done = [event.ref for event in seen if event.phase == "done" and event.ref]
    if not done:
        return None
    ref = done[-1]
    if request.places is not None:
        manifest = f"{request.places.version_url(ref)}/metadata.yaml"
    else:
        manifest = str(Catalog(request.catalog).resolve(ref) / "metadata.yaml")
    # A run that builds says it validates and publishes; one with nothing to do goes straight to done.
    return BuildResult(ref=ref, manifest_path=manifest, created=any(event.phase == "finish" for event in seen))


def _finish_here(request: Any, display: Any) -> Any:
    """The rest of the build in this process, as ``--no-prefect`` runs it: the jobs done so far are kept."""
    from shardflow.cli.progress import BuildProgress, Progress
    from shardflow.pipeline import ThreadExecutor, run_request

    progress = BuildProgress(request.config.name, display)
    with display, ThreadExecutor(request.workers) as executor:
        # Watched: the jobs done while the server started are shown as found, not as run now.
        result = run_request(request, progress.watching(executor), progress)
        display(Progress(dataset=request.config.name, phase="done", done=1, total=1, ref=result.ref))
    return result


def _run_flow(request: Any, display: Any, server: Any, seen: list[Any]) -> Any:
    from prefect.settings import get_current_settings

    from shardflow.cli.progress import listening
    from shardflow.flows.build import build_dataset, require_real_api
    from shardflow.flows.console import console_to, filtered_console, quiet_prefect_tracebacks, recorded_note
    from shardflow.flows.server import gone_server, watch_server

    if request.runner == "dask":
        require_real_api(request.runner, request.address)  # before any run
    quiet_prefect_tracebacks()
    ends = _Ends(seen)
    with filtered_console() as console:
        try:
            with server.serve() if server else contextlib.nullcontext(None) as temporary, display, \
                    console_to(display.console), listening(display), listening(ends.append), watch_server():
                # A temporary server: ours, or Prefect's own (no API URL) when we started none.
                console.hide_links = temporary if temporary is not None else not get_current_settings().api.url
                return build_dataset(config=request.config, workers=request.workers, data_root=request.data_root,
                                     catalog=request.catalog, runner=request.runner, address=request.address,
                                     scratch=request.scratch)
        finally:
            if console.hide_links and console.run_path and gone_server() is None:  # its link would be dead
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


def _served_places(request: Any) -> tuple[str, str]:
    """The data root and catalog a served run writes, whatever directory it starts in: a bucket's URLs as given
    (the options, else the environment), local ones absolute (the defaults, ``$SHARDFLOW_DATA_ROOT`` or
    ``./data`` and ``$SHARDFLOW_CATALOG`` or ``./manifests``, resolved now)."""
    places = request.places
    if places is not None:
        return request.data_root or places.data_root_url, request.catalog or places.catalog_url
    from shardflow.catalog import default_catalog, default_data_root

    return str(default_data_root(request.data_root)), str(default_catalog(request.catalog))


def serve_deployment(request: Any, *, cron: str | None, timezone: str | None, name: str, limit: int | None,
                     dry_run: bool) -> int:
    """Register ``request`` as a deployment of ``build_dataset`` named ``name`` and serve its runs (``dry_run``:
    print it as JSON instead)."""
    if not dry_run:
        os.environ.update({**PREFECT_DEFAULTS, **os.environ})  # before Prefect's import
    schedules = _schedules(cron, timezone)
    from prefect.types.entrypoint import EntrypointType

    from shardflow.flows.build import build_dataset, dataset_tag
    from shardflow.tasks.build import TAGS

    config = request.config
    data_root, catalog = _served_places(request)
    deployment = build_dataset.to_deployment(
        name=name,
        schedules=schedules,
        parameters={"config": config.to_dict(), "workers": request.workers, "data_root": data_root,
                    "catalog": catalog, "runner": request.runner, "address": request.address,
                    "scratch": request.scratch},
        tags=[*TAGS, dataset_tag(config.name)],
        description=f"Build the {config.name} dataset",
        # The installed module (shardflow.flows.build.build_dataset), not a path relative to this directory.
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    full_name = f"{deployment.flow_name}/{deployment.name}"
    if dry_run:
        print(json.dumps({"deployment": full_name, "entrypoint": deployment.entrypoint, "cron": cron,
                          "timezone": timezone, "tags": deployment.tags, "parameters": deployment.parameters,
                          "description": deployment.description}, indent=2))
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
