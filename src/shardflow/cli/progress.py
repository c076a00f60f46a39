"""Build progress: events the flow emits as work finishes, and the terminal display of the CLI.

The ``build_dataset`` flow calls :func:`emit` each time a work unit or a shard
finishes; anything in the same process can listen with :func:`listening`
(the ``shardflow build`` command does, to draw its progress bar). The Prefect
UI gets the same information from the run's progress artifact.

The display is a ``rich`` progress bar (work units, tokens/s, ETA) when
standard error is a terminal, and plain throttled lines when it is piped or
runs under CI (``CI`` set) or ``TERM=dumb``; standard output is left alone, so
the command's last line stays the manifest path. Its first line (:func:`announce`)
says what will be built, before anything slow starts.

Rates and ETAs count only the jobs run since the stage's jobs started here:
jobs the driver found done already (a resumed run; with a temporary Prefect
server, the jobs this command ran while it started) are shown as found done,
not as speed (``Progress.found``; :meth:`BuildProgress.watching` tells them apart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TextIO

__all__ = ["Progress", "emit", "listening", "BuildProgress", "Watched", "ProgressDisplay", "choose_mode", "format_rate",
           "format_eta", "first_line", "announce", "CheckProgress"]

log = logging.getLogger("shardflow.flows")


@dataclass(frozen=True)
class Progress:
    """One step of a build: ``done`` of ``total`` items of ``phase`` finished."""

    dataset: str
    phase: str
    """``tokenize`` (work units), ``write`` (shards), ``finish`` (validate and publish), ``done``."""
    done: int
    total: int
    tokens: int = 0
    """Tokens produced so far in this phase (tokenize), or written (write), found done ones included."""
    elapsed: float = 0.0
    """Seconds since the phase's jobs started running here (the jobs found done take none)."""
    ref: str | None = None
    found: int = 0
    """Of ``done``: the items found done already (committed before this run reached them), not run here."""
    found_tokens: int = 0
    """Of ``tokens``: those of the ``found`` items."""

    @property
    def fraction(self) -> float:
        return 1.0 if self.total <= 0 else min(1.0, self.done / self.total)

    @property
    def ran(self) -> int:
        """Items run here (``done`` less ``found``)."""
        return self.done - self.found

    @property
    def tokens_per_second(self) -> float:
        """Over the items run here only: the found ones took no time here."""
        return (self.tokens - self.found_tokens) / self.elapsed if self.elapsed > 0 and self.ran > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the pace of the items run here, or None before the first one."""
        if self.ran <= 0 or self.elapsed <= 0:
            return None
        return max(0.0, (self.total - self.done) * self.elapsed / self.ran)


_listeners: list[Callable[[Progress], None]] = []
_lock = threading.Lock()


def emit(event: Progress) -> None:
    """Tell every listener; a failing listener is logged, never fails the build."""
    with _lock:
        listeners = list(_listeners)
    for fn in listeners:
        try:
            fn(event)
        except Exception:  # a display problem must not fail a build
            log.debug("progress listener %r failed", fn, exc_info=True)


@contextlib.contextmanager
def listening(fn: Callable[[Progress], None]) -> Iterator[None]:
    with _lock:
        _listeners.append(fn)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(fn)


class BuildProgress:
    """The build driver's events (``shardflow.pipeline.Events``) as ``Progress``: units tokenized, shards written.

    ``display`` gets each ``Progress`` (a ``ProgressDisplay``, or :func:`emit`
    to whoever listens). Counts, tokens and seconds per stage are kept for a
    run's summary.

    The driver reports a stage's jobs found done (``Stage.done``) before it hands
    the rest to its executor: on :meth:`watching`'s executor, those are counted
    as found (``found``, ``found_tokens``, :meth:`job_found`), and a stage's
    seconds and rates start when its executor starts its jobs. Without it, every
    job counts as run, from the stage's start.
    """

    PHASES = {"tokenize-unit": "tokenize", "write-shard": "write"}

    def __init__(self, name: str, display: Callable[[Progress], None] = emit) -> None:
        self.name, self.display = name, display
        self.started = time.monotonic()
        self.plan: Any = None
        self.counts: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.began: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        """Per stage: from the start of its jobs here to the end of its last one (0.0: every job was found done)."""
        self.found: dict[str, int] = {}
        self.found_tokens: dict[str, int] = {}
        self._running: set[str] = set()  # stages whose executor has started their jobs: what finishes now ran
        self._watched = False

    def watching(self, executor: Any) -> "Watched":
        """``executor``, telling this object as it starts a stage's jobs, so that jobs found done are told apart."""
        self._watched = True
        return Watched(executor, self)

    def running(self, stage: Any, jobs: Any) -> None:
        """The executor starts ``stage``'s remaining ``jobs``: the ones reported before were found done."""
        self._running.add(stage.name)
        self.began[stage.name] = time.monotonic()
        if stage.name in self.PHASES and self.found.get(stage.name) and len(jobs):
            self.step(stage.name)  # shown at once: these were found done, the rest runs now

    def planned(self, plan: Any) -> None:
        self.plan = plan

    def stage_started(self, stage: Any, plan: Any, jobs: Any) -> None:
        self.began[stage.name] = time.monotonic()
        self._running.discard(stage.name)
        self.totals[stage.name], self.counts[stage.name], self.tokens[stage.name] = len(jobs), 0, 0
        self.found[stage.name], self.found_tokens[stage.name], self.seconds[stage.name] = 0, 0, 0.0
        if stage.name in self.PHASES:
            self.step(stage.name)
        elif stage.name == "validate":
            self.display(Progress(dataset=self.name, phase="finish", done=0, total=1))

    def job_done(self, stage: Any, plan: Any, job: Any, result: Any) -> None:
        tokens = int(getattr(result, "tokens", 0) or 0)
        self.counts[stage.name] = self.counts.get(stage.name, 0) + 1
        self.tokens[stage.name] = self.tokens.get(stage.name, 0) + tokens
        if self._watched and stage.name not in self._running:
            self.found[stage.name] = self.found.get(stage.name, 0) + 1
            self.found_tokens[stage.name] = self.found_tokens.get(stage.name, 0) + tokens
            self.job_found(stage, plan, job, result)
        else:
            self.seconds[stage.name] = time.monotonic() - self.began.get(stage.name, self.started)
        if stage.name in self.PHASES:
            self.step(stage.name)

    def job_found(self, stage: Any, plan: Any, job: Any, result: Any) -> None:
        """A job found done already (also reported to ``job_done``, and counted in ``found``): for subclasses."""

    def stage_failed(self, stage: Any, plan: Any, error: BaseException) -> None:
        """Whoever runs the build reports the error."""

    def ran_tokens(self, stage: str) -> int:
        """The tokens of ``stage``'s jobs run here (not found done)."""
        return self.tokens.get(stage, 0) - self.found_tokens.get(stage, 0)

    def step(self, stage: str) -> None:
        """One more job of a shown stage (or its start)."""
        running = stage in self._running or not self._watched
        self.display(Progress(dataset=self.name, phase=self.PHASES[stage], done=self.counts[stage],
                              total=self.totals[stage], tokens=self.tokens[stage],
                              elapsed=time.monotonic() - self.began[stage] if running else 0.0,
                              found=self.found.get(stage, 0), found_tokens=self.found_tokens.get(stage, 0)))


class Watched:
    """An executor (``shardflow.pipeline.Executor``) that tells a :class:`BuildProgress` as it starts a stage's jobs.

    The driver reports the jobs it finds done before it calls ``map`` (or ``start``) with the rest: the jobs
    reported before that call were found done, the ones after it ran.
    """

    def __init__(self, executor: Any, progress: BuildProgress) -> None:
        self.executor, self.progress = executor, progress
        self.shares_filesystem = executor.shares_filesystem

    def plan(self, config: Any, **where: Any) -> Any:
        return self.executor.plan(config, **where)

    def map(self, stage: Any, plan: Any, jobs: Any, on_done: Callable[[Any, Any], None]) -> list[Any]:
        self.progress.running(stage, jobs)
        return self.executor.map(stage, plan, jobs, on_done)

    def start(self, stage: Any, plan: Any, jobs: Any) -> Callable[[], list[Any]]:
        self.progress.running(stage, jobs)
        return self.executor.start(stage, plan, jobs)

    def fetch_parent(self, places: Any, config: Any) -> Any:
        return self.executor.fetch_parent(places, config)

    def push(self, request: Any, ref: str, listed: set[str]) -> None:
        self.executor.push(request, ref, listed)


def first_line(request: Any) -> str:
    """The build's first line: the dataset, its inputs (local ones counted as planning finds them, with their
    size; URLs are listed while planning) and its tokenizer. Reads only the file system's listing."""
    config = request.config
    local = [s for s in config.sources if "://" not in s or s.startswith("file://")]
    remote = [s for s in config.sources if s not in local]
    inputs = ""
    if local:
        try:
            from shardflow.sources import discover_inputs

            found = discover_inputs(local)
        except Exception:  # planning reports it, in its own words
            found = None
        if found is not None:
            size = sum(i.size for i in found)
            inputs = f"{len(found):,} input file{'s' * (len(found) != 1)} ({_bytes(size)})"
        else:
            inputs = ", ".join(local)
    if remote:
        urls = ", ".join(remote[:3]) + (f" and {len(remote) - 3} more" if len(remote) > 3 else "")
        inputs = (f"{inputs} and " if inputs else "") + f"{urls} (listed while planning)"
    return f"shardflow: {config.name}: building from {inputs}, tokenizer {config.tokenizer}"


def announce(request: Any, mode: str = "auto", stream: TextIO | None = None) -> None:
    """Print :func:`first_line` on stderr at once, before anything slow starts: on a terminal (the bar), or when
    ``--progress plain`` asks for lines. Output piped without asking (scripts, CI logs) gets none: there a bad
    input's message stays the only line, and the build's progress lines come as its jobs run."""
    stream = stream or sys.stderr
    if mode == "plain" or choose_mode(mode, stream) == "bar":
        print(first_line(request), file=stream, flush=True)


def format_rate(tokens_per_second: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens_per_second >= scale:
            return f"{tokens_per_second / scale:.1f}{unit} tokens/s"
    return f"{tokens_per_second:.0f} tokens/s"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA ?"
    s = int(round(seconds))
    return f"ETA {s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def choose_mode(requested: str = "auto", stream: TextIO | None = None) -> str:
    """``bar``, ``plain`` or ``none``: ``auto`` is a bar on a terminal, plain lines when piped or under CI."""
    if requested != "auto":
        return requested
    stream = stream or sys.stderr
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return "plain"
    try:
        return "bar" if stream.isatty() else "plain"
    except (AttributeError, ValueError):
        return "plain"


_PHASE_WORDS = {"tokenize": "work units", "write": "shards"}


class ProgressDisplay:
    """Listens to build progress and draws it: a rich bar, plain lines, or nothing."""

    def __init__(self, mode: str = "auto", *, stream: TextIO | None = None, interval: float | None = None) -> None:
        self.stream = stream or sys.stderr
        self.mode = choose_mode(mode, self.stream)
        env_interval = os.environ.get("SHARDFLOW_PROGRESS_INTERVAL")
        self.interval = interval if interval is not None else float(env_interval) if env_interval else 5.0
        self._last_line = 0.0
        self._last_phase: str | None = None
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self.console: Any = None
        """The bar's rich console while it is shown: other log lines print above the bar through it."""

    # -- context management -------------------------------------------------
    def __enter__(self) -> "ProgressDisplay":
        if self.mode == "bar" and self._bar is None:
            self._start_bar()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self.console = None

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, force_terminal=True)
        self._tasks = {}  # a bar started again (the display entered again) draws its phases anew
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[what]}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._bar.start()
        self.console = console

    # -- events ---------------------------------------------------------------
    def __call__(self, ev: Progress) -> None:
        if self.mode == "bar":
            if self._bar is None:  # shown before the display was entered: the bar starts now, its exit stops it
                self._start_bar()
            self._draw_bar(ev)
        elif self.mode == "plain":
            self._print_line(ev)

    def _draw_bar(self, ev: Progress) -> None:
        if ev.phase not in _PHASE_WORDS:
            return
        key = ev.phase
        fields = dict(
            what=_PHASE_WORDS[ev.phase] + (f" ({ev.found} found done)" if ev.found else ""),
            rate=format_rate(ev.tokens_per_second) if ev.phase == "tokenize" and (ev.ran or not ev.found) else "",
            eta=format_eta(ev.eta) if ev.done < ev.total else "",
        )
        if key not in self._tasks:
            label = f"{ev.dataset} tokenize" if ev.phase == "tokenize" else f"{ev.dataset} write"
            self._tasks[key] = self._bar.add_task(label, total=ev.total, completed=ev.done, **fields)
        else:
            self._bar.update(self._tasks[key], total=ev.total, completed=ev.done, **fields)

    def _print_line(self, ev: Progress) -> None:
        now = time.monotonic()
        first_or_last = ev.phase != self._last_phase or ev.done >= ev.total or ev.phase == "done"
        if not first_or_last and now - self._last_line < self.interval:
            return
        self._last_line, self._last_phase = now, ev.phase
        if ev.phase == "done":
            line = f"shardflow: {ev.dataset}: done, {ev.ref}"
        elif ev.phase == "finish":
            line = f"shardflow: {ev.dataset}: validating and publishing"
        else:
            line = f"shardflow: {ev.dataset}: {ev.phase} {ev.done}/{ev.total} {_PHASE_WORDS.get(ev.phase, '')}"
            line += f" ({100 * ev.fraction:.0f}%)"
            if ev.found:  # items found done took no time here: named apart, and out of the rate and the ETA
                line += f", {ev.found} found done" + (f" and {ev.ran} run here" if ev.ran else "")
                if ev.phase == "tokenize" and ev.ran:
                    line += f": {ev.tokens - ev.found_tokens:,} tokens at {format_rate(ev.tokens_per_second)}"
            elif ev.phase == "tokenize":
                line += f", {ev.tokens:,} tokens, {format_rate(ev.tokens_per_second)}"
            if ev.done < ev.total:
                line += f", {format_eta(ev.eta)}"
        print(line, file=self.stream, flush=True)


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


class CheckProgress:
    """Plain, throttled lines on stderr while a version's files are checked (``shardflow validate``, ``push
    --repair``), whatever stderr is: ``shardflow: validate wiki@v3: fetched 120 of 4,000 files (3.2 GiB of 80.0
    GiB), 25s``. None before the first interval (``SHARDFLOW_PROGRESS_INTERVAL`` seconds, else 5) has passed,
    so a short run prints nothing; then at most one per interval."""

    def __init__(self, what: str, *, stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        env_interval = os.environ.get("SHARDFLOW_PROGRESS_INTERVAL")
        self.what, self.stream, self.clock = what, stream, clock
        self.interval = interval if interval is not None else float(env_interval) if env_interval else 5.0
        self._lock = threading.Lock()
        self._began = self._last = clock()

    def phase(self, verb: str, noun: str = "files") -> Callable[[int, int], Callable[[int], None]]:
        """The ``progress`` argument of one phase (``fetch_version``'s, ``validate_dir``'s): called with its totals,
        it returns what each checked item's bytes are told to; ``verb`` (``fetched``) and ``noun`` name them."""

        def begin(items: int, total: int) -> Callable[[int], None]:
            count = [0, 0]

            def advance(nbytes: int) -> None:
                with self._lock:
                    count[0] += 1
                    count[1] += nbytes
                    now = self.clock()
                    if now - self._last < self.interval:
                        return
                    self._last = now
                    line = (f"shardflow: {self.what}: {verb} {count[0]:,} of {items:,} {noun} ({_bytes(count[1])} of "
                            f"{_bytes(total)}), {now - self._began:.0f}s")
                print(line, file=self.stream or sys.stderr, flush=True)

            return advance

        return begin
