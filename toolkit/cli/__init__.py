"""The `tk` command line: the group and its error handling here, one module per command in commands/,
what they share in options.py. Heavy imports (torch, onnxruntime) live inside the commands, so
`tk --help` is instant and `tk translate` never loads torch."""

from __future__ import annotations

import os
import sys

import click

from toolkit import __version__
from toolkit.cli.commands.attention import attention, plot
from toolkit.cli.commands.bench import bench
from toolkit.cli.commands.evaluate import evaluate
from toolkit.cli.commands.export import export
from toolkit.cli.commands.serve import serve
from toolkit.cli.commands.train import train
from toolkit.cli.commands.translate import translate
from toolkit.cli.commands.translate_corpus import translate_corpus
from toolkit.cli.commands.verify import verify
from toolkit.core.errors import ToolkitError, first_line


class Group(click.Group):
    """Turns every ToolkitError into one line on stderr and its exit code, never a traceback.

    Ctrl-C and SIGTERM exit 130; an OS error (a full disk, a vanished file) is one line and exit 1;
    anything else is a bug in tk, reported in one line as such (TK_DEBUG=1 shows the traceback).
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ToolkitError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except click.exceptions.UsageError as e:
            # One line, like every other error: click's default adds the usage and a hint around it.
            click.echo(f"error: {e.format_message()} (see tk {ctx.invoked_subcommand or ''} --help)".replace("  ", " "), err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as e:
            if os.environ.get("TK_DEBUG"):
                raise
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"error: {e.strerror or e}{where}; free space or choose another path and retry", err=True)
            sys.exit(1)
        except Exception as e:
            if os.environ.get("TK_DEBUG"):
                raise
            first = first_line(e)
            click.echo(f"error: internal error in tk ({type(e).__name__}: {first}); please report it (TK_DEBUG=1 shows the traceback)",
                       err=True)
            sys.exit(1)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="tk")
def main() -> None:
    """tk: train attention models, export them to ONNX, verify parity, translate with the graphs alone."""


for command in (train, export, verify, translate, evaluate, bench, attention, plot, serve, translate_corpus):
    main.add_command(command)
