"""One module per ``planner`` subcommand; each is a value there, ``COMMAND`` (:class:`planner.commands._args.Subcommand`)."""
