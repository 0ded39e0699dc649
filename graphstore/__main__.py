"""``python -m graphstore`` is the ``graphstore`` command."""

import sys

from graphstore.cli import main

sys.exit(main())
