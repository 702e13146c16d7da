"""``python -m moge_rs ...``: the ``moge`` command line (where another package's ``moge``
command, upstream's ``dlr-moge``, took the name on PATH)."""

from ._cli import main

main()
