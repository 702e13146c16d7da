"""The ``moge`` command that the wheel installs: the command line of the ``moge`` binary, run
in-process by the native module (the same source), so ``pip install`` needs no Rust."""

import signal
import sys

from . import _native


def main() -> None:
    # Ctrl-C as the binary has it: the commands that stop gracefully install their own handler
    # (which does not chain to the default one), the others end the process. Python's handler
    # would only raise KeyboardInterrupt after the command returned, losing its exit status.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_native.cli_main(["moge"] + sys.argv[1:]))


if __name__ == "__main__":
    main()
