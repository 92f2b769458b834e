"""``python -m exporter`` runs the exporter CLI."""

from exporter.shell.cli import main

raise SystemExit(main())
