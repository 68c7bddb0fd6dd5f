"""User-facing entry points: the `encdec` command line (`cli.main`)."""
