"""The version of declop (one place; setup.cfg and the CLI read it)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
