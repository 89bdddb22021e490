"""``python -m trimtab ...``: the same command line as the ``trimtab`` console script."""

import sys

from trimtab.cli import main

sys.exit(main())
