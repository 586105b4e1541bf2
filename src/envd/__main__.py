"""``python -m envd``: the ``envd`` command (envd.tools.cli), for when the console
script is not on PATH (e.g. a virtualenv that is not activated)."""
import sys

from envd.tools.cli import main

sys.exit(main())
