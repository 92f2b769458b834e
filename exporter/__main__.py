"""``python -m exporter`` runs the exporter CLI."""

from exporter.cli import main

raise SystemExit(main())
