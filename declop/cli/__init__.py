"""The ``declop`` command: one module per command, the flags of ``run`` and ``dev`` generated from
the manager's options, the help format, and logging set-up and exit codes in one place.

``declop.cli.main`` (the console script) and ``declop.cli.cli`` (the click group) are re-exported
here from :mod:`declop.cli.entry`: this package took the place of the ``declop/cli.py`` module.

May import everything below it, ``testing`` included (``declop dev`` runs a control plane).
"""

from declop.cli.entry import cli, main

__all__ = ["cli", "main"]
