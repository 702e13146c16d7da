"""The ``moge`` command that the wheel installs: the command line of the ``moge`` binary, run
in-process by the native module (the same source), so ``pip install`` needs no Rust."""

import sys

from . import _native


def main() -> None:
    sys.exit(_native.cli_main(["moge"] + sys.argv[1:]))


if __name__ == "__main__":
    main()
