"""``python -m bnnsfw``: the same command line as the ``bnnsfw`` script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
