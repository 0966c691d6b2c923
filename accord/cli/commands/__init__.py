"""One module per `accord` subcommand."""
