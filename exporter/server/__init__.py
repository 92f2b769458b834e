"""The HTTP server of the published snapshot: app, HTTP/1.1 protocol and wire, limits, stats, TLS and auth."""
