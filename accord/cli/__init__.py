"""The `accord` command line: the parser (`main`), one module per subcommand under
`commands`, and the server launcher."""
