"""Dask's client notice of a rescheduled gather is not printed beside the build's own one-line error."""

from __future__ import annotations

import logging

from shardflow.pipeline.dask_executor import QuietReschedules, quiet_reschedules


def test_the_reschedule_notice_is_dropped_and_every_other_client_warning_kept(caplog) -> None:
    quiet_reschedules()
    quiet_reschedules()  # once per process, however many executors
    logger = logging.getLogger("distributed.client")
    assert sum(isinstance(f, QuietReschedules) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="distributed.client"):
        # The call as distributed's Client makes it when a worker holding a result is gone.
        logger.warning("Couldn't gather %s keys, rescheduling %s", 1, ("_run_sent-1b729fa4",))
        logger.warning("Worker %s disconnected", "tcp://127.0.0.1:46703")
    assert [r.getMessage() for r in caplog.records] == ["Worker tcp://127.0.0.1:46703 disconnected"]
