"""``shardflow card REF``: draw a published version's dataset card again, without rebuilding.

A rebuild of unchanged inputs publishes nothing ("nothing new"), so it cannot
add the plots a version lacks (built before matplotlib was installed) or
redraw them after a change in how they are drawn. This command reads the
version's ``stats.json`` (checked against the manifest first) and rewrites
``card/``; the card is not in the manifest's checksums, so the version stays
valid (``shardflow validate``). Never imports Prefect.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_card_parser", "cmd_card"]


def add_card_parser(sub: Any) -> None:
    """Add ``card`` to the command line's subcommands (``sub``: what ``add_subparsers`` returned)."""
    from .options import add_command

    add_command(sub, "card", "draw a version's dataset card (its page and plots) again, without rebuilding",
                "Redraw the dataset card of REF from its stats.json: the plots and card/README.md, each file "
                "replaced whole. The version's data and manifest are not touched.")


def cmd_card(args: argparse.Namespace) -> int:
    from shardflow.card import card_path, redraw_card
    from shardflow.catalog import resolve_ref
    from shardflow.manifest import read_manifest

    directory = resolve_ref(args.ref, args.catalog)
    plots = redraw_card(directory, catalog=args.catalog)
    n = len(plots)
    print(f"drew the card of {read_manifest(directory).ref}: {n} plot{'s' * (n != 1)} ({', '.join(plots)})")
    print(card_path(directory))
    return 0
