"""Package discovery; every other piece of metadata is in pyproject.toml.

The core lives in ``src/shardflow``. The repository's top-level ``flows/`` and
``tasks/`` directories install as ``shardflow.flows`` and ``shardflow.tasks``,
so no generic top-level name (``flows``, ``tasks``) lands in site-packages.
Every package is found by ``find_packages``, so a new subpackage cannot be left
out of the wheel; ``tests/test_packaging.py`` builds the wheel and checks it.
"""

from setuptools import find_packages, setup

ORCHESTRATION = {f"shardflow.{name}": name.replace(".", "/") for name in find_packages(".", include=["flows", "flows.*", "tasks", "tasks.*"])}

setup(packages=[*find_packages("src"), *ORCHESTRATION], package_dir={"": "src", **ORCHESTRATION})
