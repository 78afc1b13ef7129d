"""The package's version, in a module of its own so that every layer can read it (the generated Java names it)."""

__version__ = "0.1.0"
