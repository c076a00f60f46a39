"""Prefect flows composing shardflow's tasks, and the ``shardflow`` command line."""
