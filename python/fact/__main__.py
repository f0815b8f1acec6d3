"""`python -m fact`: the same as the `fact` command."""

import sys

from fact.cli import main

sys.exit(main())
