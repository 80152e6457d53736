"""``python -m air_transfer.cli``: the ``air-transfer`` console script."""

from air_transfer.cli.main import main

raise SystemExit(main())
