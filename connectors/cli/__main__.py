"""`python -m connectors.cli`: the `streammargin` command."""

import sys

from connectors.cli import main

sys.exit(main())
