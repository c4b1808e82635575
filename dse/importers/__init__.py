"""Importers of other tools' files as dse spaces."""
