"""The shipped spaces (spaces/) and systems (systems/), package data of dse: read them with
``importlib.resources.files("dse.conf")`` (``dse.rules.space.shipped``), never through a path beside the source."""
