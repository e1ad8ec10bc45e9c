"""``python -m dl2``: the same as the ``dl2`` console script."""

import sys

from dl2.cli import main

sys.exit(main())
