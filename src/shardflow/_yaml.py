"""Bounded YAML parsing of the files shardflow trusts least: manifests and catalog files.

A version directory or a catalog may come from anyone (a shared filesystem, a
copied tree), so reading one must not let it exhaust memory or time:

* the file is read only up to a size limit (a manifest of 100,000 shards is
  about 40 MB; the limits are far above what shardflow writes);
* the document is composed into YAML nodes first, with libyaml's parser where
  available (it also caps nesting depth), and checked before any Python object
  is built: aliases may repeat at most ``MAX_ALIAS_NODES`` nodes in all (a
  billion-laughs bomb of 10 KB expands to 10^9), a recursive alias is refused,
  and no sequence or mapping may hold more than ``MAX_COLLECTION_ITEMS`` items;
* only the safe constructor builds objects (no ``!!python`` tags).

Aliases are capped rather than refused, because ``yaml.safe_dump`` writes an
anchor for an object that appears twice in what it dumps.
Everything here is public PyYAML API: ``Loader.get_single_node`` and
``construct_document``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlRefused", "load_yaml_file", "MAX_ALIAS_NODES", "MAX_COLLECTION_ITEMS"]

MAX_ALIAS_NODES = 100_000
"""How many nodes all the aliases of one document may stand for together (an honest file repeats a few)."""
MAX_COLLECTION_ITEMS = 10_000_000
"""Items in one YAML sequence or mapping."""


class YamlRefused(ValueError):
    """A YAML file that is refused before it is built into objects; the message says why (without the path)."""


def _loader_class() -> type:
    # libyaml's parser when available: about 7x faster on a manifest of thousands of shards.
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


def check_node(root: yaml.Node | None) -> None:
    """Refuse a composed document whose aliases expand too far, that refers to itself, or with a huge collection.

    Walks each distinct node once (aliases share node objects) and adds up how
    many nodes the fully expanded document would have.
    """
    if root is None:
        return
    expanded: dict[int, int] = {}  # id(node) -> nodes it stands for, expanded
    distinct = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            if key not in expanded:
                expanded[key] = 1
                distinct += 1
            continue
        items = _children(node)
        if children_done:
            open_nodes.discard(key)
            expanded[key] = 1 + sum(expanded[id(c)] for c in items)
            distinct += 1
            continue
        if key in expanded:
            continue
        if key in open_nodes:
            raise YamlRefused(f"{_where(node.start_mark)}an alias refers to a collection that contains it")
        if len(node.value) > MAX_COLLECTION_ITEMS:
            raise YamlRefused(
                f"{_where(node.start_mark)}a collection of {len(node.value):,} items, more than the "
                f"{MAX_COLLECTION_ITEMS:,} allowed"
            )
        open_nodes.add(key)
        stack.append((node, True))
        for child in items:
            if id(child) in open_nodes:
                raise YamlRefused(f"{_where(child.start_mark)}an alias refers to a collection that contains it")
            if id(child) not in expanded:
                stack.append((child, False))
    total = expanded[id(root)]
    if total - distinct > MAX_ALIAS_NODES:
        raise YamlRefused(
            f"its aliases expand it to {total:,} nodes from {distinct:,} written (an alias bomb?); at most "
            f"{MAX_ALIAS_NODES:,} nodes may be repeated by aliases"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value)


def load_yaml_text(text: str) -> Any:
    """Parse one YAML document with the safe constructor, refusing alias bombs (``YamlRefused``).

    Raises ``yaml.YAMLError`` for text that is not YAML.
    """
    loader = _loader_class()(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer on deep nesting (libyaml caps the depth itself)
            raise YamlRefused("nested too deeply") from None
        check_node(node)
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml_file(path: Path | str, *, max_bytes: int) -> Any:
    """Read and parse ``path`` (at most ``max_bytes``) with ``load_yaml_text``'s checks.

    Raises ``YamlRefused`` (oversized, not UTF-8, alias bomb), ``yaml.YAMLError``
    and the ``OSError`` of opening the file; the caller names the file.
    """
    return load_yaml_text(_read_bounded(Path(path), max_bytes))
