"""``python -m kvobs`` runs the ``kvobs`` command."""

import sys

from kvobs.cli import main

sys.exit(main())
