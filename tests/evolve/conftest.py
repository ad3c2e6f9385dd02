"""The `collab evolve` command as main.py registers it, for the tests that invoke it."""

from __future__ import annotations

import pytest
import typer

from collabrl.cli import options as opt
from collabrl.cli.evolve import evolve


@pytest.fixture
def cli() -> typer.Typer:
    """`collab evolve` as main.py registers it (without importing every other command)."""
    app = typer.Typer()
    app.command("evolve", cls=opt.config_command("evolve"))(evolve)
    app.command("other")(lambda: None)  # two commands: `evolve` stays a subcommand
    return app
