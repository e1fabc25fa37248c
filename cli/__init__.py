"""The `inflight` command line: one module per subcommand, imported only when used."""
