"""The NeMo 2 payload: recipe factories registered with nemo-run and the ``python -m recipes.nemo2`` entry point.

Importing this package imports no NeMo: :mod:`spec`, :mod:`userbuffers` and :mod:`argv` are plain data and
functions the controller may read; :mod:`factories` and :mod:`__main__` need NeMo and run in the container.
"""
