"""`python -m fsbench.cli ...`: the same as the `fsbench` command."""
import sys

from fsbench.cli.dispatch import main

sys.exit(main())
