"""The imperative shell: command line, configuration, logging, the start-up summary and the cycle's state log."""
