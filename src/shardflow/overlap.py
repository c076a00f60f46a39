"""A job's reading overlapped with its encoding: the next batch is read while this one is tokenized.

A tokenize job reads a batch (Parquet's decoding, JSON's parsing, the UTF-8
checks, the hash of the bytes read), encodes it, and writes its tokens, in
turn. The encoders release the GIL and use the cores they find, but while a
batch is read they have nothing to do: one job on one file kept 2 cores about
1.3 busy. :func:`ahead` runs the reading on a thread of its own, at most
``depth`` batches ahead, so memory grows by that many batches per job. A
tokenize job uses it twice: one thread reads, another encodes what was read,
and the job checks and writes what was encoded (on one file, where no second
job fills the cores, the stage took 0.88 of the time with the encoding on its
own thread).

The thread runs in a copy of the caller's context, so what the reader does in
the job's context (hashing the input as it reads it, ``sources/storage.py``)
holds there. An error in reading is raised to the job at the batch it would
have read; a job that stops early (its own error) stops the thread and waits
for it, so no input stays open behind it.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["ahead"]

T = TypeVar("T")


def ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """``items``, in order, produced on a thread of their own at most ``depth`` ahead of the consumer.

    The thread starts now, not at the first ``next``: the caller may do other
    work (the encoder's one-time set-up) while the first item is produced. An
    iterator dropped without being started stops its thread at its next item.
    """
    slots: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as exc:  # raised to the consumer, where the job handles it
            put((False, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # a generator's own cleanup (its open file) runs here, on its thread

    thread = threading.Thread(target=contextvars.copy_context().run, args=(produce,), name="shardflow-ahead", daemon=True)
    thread.start()
    consumer = _consume(slots, stop, thread)
    # A generator never started runs no ``finally`` when it is collected: its reader is told to stop here.
    weakref.finalize(consumer, stop.set)
    return consumer


def _consume(slots: queue.Queue[tuple[bool, Any]], stop: threading.Event, thread: threading.Thread) -> Iterator[Any]:
    try:
        while True:
            more, item = slots.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        thread.join()
