"""``python -m zarrfs`` runs the command line."""

from zarrfs.cli.main import main

raise SystemExit(main())
