"""dse: design-space exploration for large-model training recipes.

Its rooms, bottom to top (DESIGN.md's layer section; the import contracts in pyproject.toml): ``facts`` (the knob
catalogue, the GPU table, the containers, the allowlists, the calibration file), ``rules`` (the space, a resolved
point, the validity rules), ``perfmodel`` (the model and how it learns), the evaluation (``forecast``, ``launch``,
``execute``, ``probe``, ``reward``, ``backends``; the search: ``agents``, ``envs``, ``rl``), ``study`` (one study
and what it writes; ``dryrun``), and the interfaces (``cli``, ``results``, ``importers``), over ``errors``,
``fsutil``, ``inputs`` and ``registry``.
"""

__version__ = "0.1.0"
