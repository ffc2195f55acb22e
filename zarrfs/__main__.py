"""``python -m zarrfs`` runs the command line."""

from zarrfs.cli import main

raise SystemExit(main())
