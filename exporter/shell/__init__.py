"""The imperative shell: command line, configuration and the HTTP server."""
