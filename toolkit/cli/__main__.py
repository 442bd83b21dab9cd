"""`python -m toolkit.cli`: the `tk` command."""

from toolkit.cli import main

main()
