"""``python -m spader.cli``: the ``spader`` command."""

import sys

from spader.cli import main

sys.exit(main())
