"""``python -m guidedec``: the command line."""

import sys

from guidedec.cli import main

sys.exit(main())
