"""``python -m shardflow``: the ``shardflow`` command."""

from shardflow.cli import run

run()
