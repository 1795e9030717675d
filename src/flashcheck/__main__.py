"""python -m flashcheck: the `flashcheck` command line."""

from flashcheck.cli import main

main()
