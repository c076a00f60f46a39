"""How ``shardflow serve`` runs its deployments: each flow run forked from a process with the flow imported.

Prefect's ``serve(*deployments)`` hands its runner deployments only, so the
runner starts every flow run as ``python -m prefect.engine``, a fresh
interpreter that imports Prefect, then loads the flow from its entrypoint
(numpy, pyarrow, the build flow) before the run's first request: 1.2 s from
the runner taking the run to the run starting, every run, on the development
machine. For an incremental build that adds one input of sixteen, that was
most of the served run's fixed cost, paid on every schedule.

:func:`serve` is Prefect's ``serve`` with the flow object registered with
the runner for its deployments, as Prefect's own ``Runner.add_flow`` (and
``flow.serve``) does: the runner then runs a flow run with Prefect's
``run_flow_in_subprocess``, a multiprocessing child. :func:`use_forkserver`
makes that child a fork of multiprocessing's ``forkserver`` process, with
the build flow's modules preloaded: one server process imports them once,
when serving starts, and each run is a fork of it. Everything else is
Prefect's own: the same function, arguments and environment (Prefect passes
the runner's whole environment to the child and applies it there), the same
process object for the runner to watch, cancel and report. The fork is taken
from that server process, which runs no Python thread (only the native helpers
of OpenBLAS and of pyarrow's allocator, libraries that handle fork), never from
the runner, which runs several. Applied only by ``shardflow serve`` to its own process, on platforms
with ``fork`` (not Windows), and only if Prefect's function still asks for
``spawn`` in the one place this replaces; otherwise Prefect's spawn stays.

One difference follows: a served run executes the flow's code as imported
when serving started, so an upgrade of shardflow takes effect when ``shardflow
serve`` is restarted (as for any long-running service), not at the next run.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import sys
from typing import Any

__all__ = ["serve", "use_forkserver", "PRELOAD"]

log = logging.getLogger("shardflow.flows")


def _preload() -> list[str]:
    from shardflow.flows.startup import LATER_IMPORTS

    # The flow and Prefect's engine; what a run imports on its way (graphviz, matplotlib for
    # the card: the command line's preload list); the tokenizer families and their fast backend.
    return ["shardflow.flows.build", "shardflow.tasks.build", "prefect.flow_engine", *LATER_IMPORTS,
            "shardflow.tokenizers", "gigatoken", "tiktoken"]


PRELOAD = _preload()
"""What the fork server imports once (a name that fails to import is skipped, as multiprocessing does)."""


class _SpawnAsForkserver:
    """``prefect.flow_engine``'s ``multiprocessing``, except that its ``spawn`` context is the fork server."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def get_context(self, method: str | None = None) -> Any:
        return self._context if method == "spawn" else multiprocessing.get_context(method)

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


def use_forkserver(*, start: bool = True) -> bool:
    """Make served flow runs fork from a process with :data:`PRELOAD` imported; whether it applies.

    ``start``: start that process now (it imports for about a second), not at the first run.
    """
    import prefect.flow_engine as engine

    if isinstance(engine.multiprocessing, _SpawnAsForkserver):
        return True
    if sys.platform == "win32" or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    try:
        source = inspect.getsource(engine.run_flow_in_subprocess)
    except (OSError, TypeError):
        return False
    if source.count("multiprocessing.get_context(") != 1 or 'get_context("spawn")' not in source:
        log.debug("prefect.flow_engine.run_flow_in_subprocess changed: served runs keep Prefect's spawn")
        return False
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    engine.multiprocessing = _SpawnAsForkserver(context)  # type: ignore[attr-defined]
    if start:
        from multiprocessing import forkserver

        forkserver.ensure_running()
    return True


def serve(deployments: list[Any], *, flow: Any, limit: int | None = None) -> None:
    """Serve ``deployments`` of ``flow`` until interrupted: Prefect's ``serve``, with ``flow`` registered for them.

    Registering the flow object is what Prefect's ``Runner.add_flow`` does after
    adding the deployment; where this Prefect's runner has no registry to
    register with, its runs load the flow from the entrypoint, as before.
    """
    import asyncio

    from prefect.runner import Runner

    try:
        from prefect.exceptions import TerminationSignal
    except ImportError:  # an older Prefect
        TerminationSignal = KeyboardInterrupt  # type: ignore[misc,assignment]  # noqa: N806

    use_forkserver()
    runner = Runner(pause_on_shutdown=True, limit=limit)
    registry = getattr(runner, "_deployment_registry", None)
    for deployment in deployments:
        deployment_id = runner.add_deployment(deployment)
        if registry is not None and hasattr(registry, "register_flow"):
            registry.register_flow(deployment_id, flow)
    import prefect.flows

    show = getattr(prefect.flows, "_display_serve_start_message", None)  # Prefect's own start message
    if show is not None:
        show(*deployments)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal) as exc:
        log.info("Received %s, shutting down...", type(exc).__name__)
