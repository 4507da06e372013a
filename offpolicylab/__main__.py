"""``python -m offpolicylab ...`` = the ``offpolicylab`` command."""

from offpolicylab.cli import main

raise SystemExit(main())
