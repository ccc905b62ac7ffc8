"""Run the `toolkit` CLI in-process (click's CliRunner) at a given console width.

The CLI's rich consoles are made when toolkit.cli is imported and keep the COLUMNS of that moment
(pytest-xdist workers run with COLUMNS=80), so COLUMNS in the runner's environment alone does not
set their width: `invoke` sets it on the consoles for the call, and restores it.
"""

from __future__ import annotations

from click.testing import Result
from typer.testing import CliRunner

from toolkit import cli

runner = CliRunner()


def invoke(args: list[str], columns: int = 200) -> Result:
    consoles = (cli.console, cli.err_console)
    fixed = [c._width for c in consoles]  # None: follows the terminal
    for c in consoles:
        c.width = columns
    try:
        return runner.invoke(cli.app, args, env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    finally:
        for c, width in zip(consoles, fixed):
            c._width = width
