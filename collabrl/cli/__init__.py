"""The `collab` command line: thin Typer commands over library functions."""
