"""Bounded YAML parsing of the files shardflow trusts least: manifests and catalog files.

A version directory or a catalog may come from anyone (a shared filesystem, a
copied tree), so reading one must not let it exhaust memory or time:

* the file is read only up to a size limit (a manifest of 100,000 shards is
  about 35 MB; the limits are far above what shardflow writes);
* its parser events are streamed once and checked before any node or Python
  object is built (``check_events``, libyaml's parser where available): at most
  ``MAX_NODES`` nodes, ``MAX_DEPTH`` levels, ``MAX_COLLECTION_ITEMS`` items in
  one sequence or mapping; aliases may repeat at most ``MAX_ALIAS_NODES`` nodes
  in all (a billion-laughs bomb of 10 KB expands to 10^9); a recursive alias is
  refused; values the caller names as unique (a manifest's shard files) are
  refused at their second appearance. Each is refused as soon as it is seen,
  holding only the open collections, so a hostile file costs little more than
  reading up to the point where it is refused;
* only then is the document composed and built, by the safe constructor only
  (no ``!!python`` tags).

Aliases are capped rather than refused, because ``yaml.safe_dump`` writes an
anchor for an object that appears twice in what it dumps.
Everything here is public PyYAML API: ``yaml.parse``, ``Loader.get_single_node``
and ``construct_document``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

__all__ = [
    "YamlRefused",
    "YamlRepeated",
    "load_yaml_file",
    "load_yaml_text",
    "check_events",
    "MAX_ALIAS_NODES",
    "MAX_COLLECTION_ITEMS",
    "MAX_NODES",
    "MAX_DEPTH",
]

MAX_ALIAS_NODES = 100_000
"""How many nodes all the aliases of one document may stand for together (an honest file repeats a few)."""
MAX_COLLECTION_ITEMS = 10_000_000
"""Items in one YAML sequence or mapping."""
MAX_NODES = 8_000_000
"""Nodes in one document, as written. A manifest has about 19 per shard (1.9 million for 100,000 shards;
what reading that costs: docs/PERFORMANCE.md), so this admits about 400,000 shards and bounds what reading costs."""
MAX_DEPTH = 200
"""Nesting levels; shardflow's files have fewer than ten."""


class YamlRefused(ValueError):
    """A YAML file that is refused before it is built into objects; the message says why (without the path)."""


def _loader_class() -> type:
    # libyaml's parser when available: several times faster on a manifest of thousands of shards (docs/PERFORMANCE.md).
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_bounded(path: Path, max_bytes: int) -> str:
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise YamlRefused(f"the file is larger than {max_bytes:,} bytes, the most shardflow reads for it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlRefused(f"not UTF-8 text (invalid byte at offset {exc.start})") from None


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """A parser error on one line: ``line L, column C: problem``."""
    problem = getattr(exc, "problem", None)
    if problem:
        return f"{_where(getattr(exc, 'problem_mark', None))}{problem}"
    return " ".join(str(exc).split())


class YamlRepeated(YamlRefused):
    """A value that must be unique (``load_yaml_text``'s ``unique``) found a second time, before the rest is read."""

    def __init__(self, where: str, value: str, first: str, line: int) -> None:
        super().__init__(f"line {line}: {where}: {value!r} is listed again (first at {first})")
        self.where = where
        """The path of the second listing (``splits.train.shards[1].file``)."""
        self.value = value
        self.first = first
        """The path of the first."""
        self.line = line


# One open collection of the event stream: its anchor, the nodes it stands for so far
# (itself, its children expanded), its children so far, whether it is a mapping, and the
# key its next value is under (mappings) or its next item's index (sequences).
_Frame = list  # [anchor, expanded, children, is_mapping, key]
_ANCHOR, _EXPANDED, _CHILDREN, _MAPPING, _KEY = range(5)


def _shown_path(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")


def check_events(loader_class: type, text: str, *, unique: Sequence[tuple[str, ...]] = ()) -> None:
    """Refuse a document from its parser events, before any node or object is built.

    Streams the events once, holding only the open collections, and refuses (``YamlRefused``),
    as soon as it is seen: more than ``MAX_NODES`` nodes, a collection of more than
    ``MAX_COLLECTION_ITEMS`` items, nesting deeper than ``MAX_DEPTH``, aliases standing for more than
    ``MAX_ALIAS_NODES`` nodes in all (what an anchored node stands for is counted as it closes), an
    alias to a collection that contains it, and (``YamlRepeated``) a scalar value that appears twice
    at the paths ``unique`` names (``"*"`` for any mapping key or sequence item): a file that repeats
    one entry 100,000 times is refused at the second. Parser errors are raised as the parser raises them.
    """
    anchors: dict[str, int] = {}  # anchor -> nodes it stands for (closed nodes only)
    open_anchors: set[str] = set()
    stack: list[_Frame] = []
    nodes = repeated = 0
    patterns = [tuple(p) for p in unique]
    depths = {len(p) for p in patterns}
    seen: list[dict[str, str]] = [{} for _ in patterns]

    def path() -> tuple[Any, ...]:
        return tuple(f[_KEY] for f in stack)

    def closed(count: int, anchor: str | None) -> None:
        """A node standing for ``count`` nodes (expanded) ends: it counts in its parent's total and items."""
        if anchor is not None:
            anchors[anchor] = count
        if not stack:
            return
        parent = stack[-1]
        parent[_EXPANDED] += count
        parent[_CHILDREN] += 1
        items = parent[_CHILDREN] // 2 if parent[_MAPPING] else parent[_CHILDREN]
        if items > MAX_COLLECTION_ITEMS:
            where = _shown_path(path()[:-1]) or "the document"
            raise YamlRefused(f"{where}: a collection of more than {MAX_COLLECTION_ITEMS:,} items, the most allowed")
        if not parent[_MAPPING]:
            parent[_KEY] += 1  # the next item's index

    for event in yaml.parse(text, Loader=loader_class):
        kind = type(event)
        if kind is yaml.ScalarEvent or kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
            nodes += 1
            if nodes > MAX_NODES:
                raise YamlRefused(f"it has more than {MAX_NODES:,} YAML nodes, the most shardflow reads")
        # A mapping's child is a key when its children so far are even in number.
        as_key = bool(stack) and stack[-1][_MAPPING] and stack[-1][_CHILDREN] % 2 == 0
        if kind is yaml.ScalarEvent:
            if as_key:
                stack[-1][_KEY] = event.value
            elif patterns and len(stack) in depths:
                here = path()
                for n, pattern in enumerate(patterns):
                    if len(pattern) == len(here) and all(p == "*" or p == h for p, h in zip(pattern, here)):
                        shown = _shown_path(here)
                        first = seen[n].setdefault(event.value, shown)
                        if first != shown:
                            raise YamlRepeated(shown, event.value, first, event.start_mark.line + 1)
            closed(1, event.anchor)
        elif kind is yaml.AliasEvent:
            if event.anchor in open_anchors:
                raise YamlRefused(f"{_where(event.start_mark)}an alias refers to a collection that contains it")
            count = anchors.get(event.anchor, 1)  # an unknown anchor: the composer names it
            repeated += count
            if repeated > MAX_ALIAS_NODES:
                raise YamlRefused(
                    f"{_where(event.start_mark)}its aliases repeat more than {MAX_ALIAS_NODES:,} nodes, the most "
                    "allowed (an alias bomb?)"
                )
            if as_key:
                stack[-1][_KEY] = None
            closed(count, None)
        elif kind is yaml.SequenceStartEvent or kind is yaml.MappingStartEvent:
            if as_key:
                stack[-1][_KEY] = None  # a collection as a key: no path goes through it
            if len(stack) >= MAX_DEPTH:
                raise YamlRefused(f"{_where(event.start_mark)}nested more than {MAX_DEPTH} levels deep")
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            is_mapping = kind is yaml.MappingStartEvent
            stack.append([event.anchor, 1, 0, is_mapping, None if is_mapping else 0])
        elif kind is yaml.SequenceEndEvent or kind is yaml.MappingEndEvent:
            frame = stack.pop()
            if frame[_ANCHOR] is not None:
                open_anchors.discard(frame[_ANCHOR])
            closed(frame[_EXPANDED], frame[_ANCHOR])
        elif kind is yaml.DocumentEndEvent:
            return  # a second document is the composer's to refuse


def load_yaml_text(text: str, *, unique: Sequence[tuple[str, ...]] = ()) -> Any:
    """Parse one YAML document with the safe constructor, after ``check_events``'s checks (``YamlRefused``).

    Raises ``yaml.YAMLError`` for text that is not YAML.
    """
    loader_class = _loader_class()
    check_events(loader_class, text, unique=unique)
    loader = loader_class(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer on deep nesting
            raise YamlRefused("nested too deeply") from None
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml_file(path: Path | str, *, max_bytes: int, unique: Sequence[tuple[str, ...]] = ()) -> Any:
    """Read and parse ``path`` (at most ``max_bytes``) with ``load_yaml_text``'s checks.

    Raises ``YamlRefused`` (oversized, not UTF-8, alias bomb, ``YamlRepeated``), ``yaml.YAMLError``
    and the ``OSError`` of opening the file; the caller names the file.
    """
    return load_yaml_text(_read_bounded(Path(path), max_bytes), unique=unique)
