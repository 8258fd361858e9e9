"""The `grove` command: its subcommands, the run operations under them, the demo, the worker."""
