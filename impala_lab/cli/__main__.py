"""``python -m impala_lab.cli ...``: the ``impala-lab`` command without its console script."""

import sys

from impala_lab.cli.main import main

sys.exit(main())
