"""Helpers shared by the tests, by topic (``from support.corpus import write_parquet``).

``tests/`` is on ``sys.path`` because ``tests/conftest.py`` lives there (pytest's
default ``prepend`` import mode puts a conftest's directory first), whatever
is run: the whole suite, one directory or one file, with or without xdist.
The benches add ``tests/`` themselves. Fixtures stay in the ``conftest.py``
files; a fixture made for several scopes (``s3.s3_fixture``) is a factory here.

* ``paths``: where the repository, the assets and the shared corpora are; the interpreter.
* ``corpus``: input files (Parquet, JSON Lines, the sample split in parts, generated real text) and small vocabularies.
* ``builds``: in-process builds and comparing the versions they publish.
* ``cli``: the ``shardflow`` command, in this process (``run_main``) or in a subprocess (``run_cli``).
* ``streams``, ``recut``, ``shards``: reading a version's splits back, schema 2's cuts, synthetic shard directories.
* ``tokenizer_files``: tokenizer.json and SentencePiece files trained on the shared corpora.
* ``s3``, ``prefect``, ``dask``, ``processes``, ``browser``: the servers and clusters the tests start, and their processes.
* ``suite``: the order in which xdist hands out the test files.
"""
