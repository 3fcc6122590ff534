"""One module per ``planner`` subcommand; each exposes ``register(subparsers)``."""
