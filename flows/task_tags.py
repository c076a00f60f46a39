"""Which tags the build's task runs carry: only those a tag concurrency limit on the server names.

Prefect asks the API for a concurrency slot before every task run that has
tags (``POST /v2/concurrency_limits/increment-with-lease``, one name
``tag:<tag>`` per tag), even where no such limit exists. It is the one
round trip to the server that a task run waits for, in the thread that is
about to run the work, and on a busy server (SQLite writing the run's events)
it was measured stalling a work unit's thread for up to 2.2 s
(``bench/bench_flow.py``, 1000 MB corpus).

So the flow asks once, when it starts, which of its tags have a limit
(``prefect gcl create tag:shardflow --limit 2``, or ``prefect
concurrency-limit create shardflow 2``, both stored as ``tag:`` limits), and
its task runs carry the tags only if one has: then every task run is tagged
as before and Prefect enforces the limit. Otherwise the task runs carry no
tags; the flow run keeps ``shardflow`` and ``dataset:<name>`` (filter the
Runs page by them), and every task run is in its flow run's graph and list.
When the server cannot be asked, the tags are kept (the safe side).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterable, Iterator

__all__ = ["limited_tags", "task_tags"]

log = logging.getLogger("shardflow.flows")

_PAGE = 200


def limited_tags(tags: Iterable[str]) -> list[str] | None:
    """The tags among ``tags`` that a concurrency limit on the server names; None when it cannot tell."""
    from prefect.client.orchestration import get_client

    wanted = {f"tag:{t}": t for t in tags}
    names: set[str] = set()
    try:
        with get_client(sync_client=True) as client:
            offset = 0
            while True:
                page = client.read_global_concurrency_limits(limit=_PAGE, offset=offset)
                names.update(str(limit.name) for limit in page)
                if len(page) < _PAGE:
                    break
                offset += _PAGE
    except Exception:  # an older server, a dropped connection: keep the tags, as Prefect would
        log.debug("could not read the concurrency limits; task runs keep their tags", exc_info=True)
        return None
    return sorted(t for name, t in wanted.items() if name in names)


@contextlib.contextmanager
def task_tags(*tags: str) -> Iterator[list[str]]:
    """Run the block with ``tags`` on its task runs if a limit names one of them (or the server cannot tell), else none.

    The task runs then also carry the tags already in force (the command
    line's); yields the tags the task runs carry.
    """
    from prefect.context import FlowRunContext, TagsContext
    from prefect.context import tags as prefect_tags

    current = set(TagsContext.get().current_tags or ())
    run = FlowRunContext.get()
    if run is not None and run.flow_run is not None:  # a deployment's own tags (serve) count too
        current |= set(run.flow_run.tags or ())
    every = sorted(current | set(tags))
    limited = limited_tags(every)
    if limited is None or limited:
        with prefect_tags(*tags) as in_force:
            yield sorted(in_force)
        return
    empty: Any = TagsContext(current_tags=set())
    with empty:
        yield []
