"""dse: design-space exploration for large-model training recipes."""

__version__ = "0.1.0"
