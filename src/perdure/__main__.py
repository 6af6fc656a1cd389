"""``python -m perdure`` runs the command line."""

import sys

from perdure.cli.main import main

sys.exit(main())
