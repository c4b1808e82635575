"""One study: the agent loop (``loop``), its output directory (``outdir``), what it writes as it goes (``recording``:
store rows, packed logs, ``leaderboard``, ``best``), its tables (``store``), ``--parallel`` and ``--worker``
(``parallel``, ``claims``), the probe screen's records (``probe_screen``) and a study per GPU generation
(``generations``).
"""
