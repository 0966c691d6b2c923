"""`python -m accord`: the `accord` command, without relying on an installed script."""

from accord.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
