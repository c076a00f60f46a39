"""The ``shardflow`` command line (``shardflow.cli:run``; ``python -m shardflow`` is the same).

``main`` parses and runs one command: ``build``, ``embed`` and ``serve``
(``build.py``); ``validate``, ``ls``, ``show``, ``diff``, ``rm``, ``gc`` and ``push``
(``versions.py``); ``card`` (``card.py``). Only ``build`` and ``serve`` import
Prefect, through ``shardflow.flows``, inside the command.
"""

from .commands import build_parser, main, run

__all__ = ["main", "run", "build_parser"]
