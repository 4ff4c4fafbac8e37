"""`python -m longrope.search.cli`: the `longrope` console script without the script."""

import sys

from longrope.search.cli.main import main

sys.exit(main())
