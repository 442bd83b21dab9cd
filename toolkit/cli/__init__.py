"""The `tk` command line: the group and its error handling here, one module per command in commands/,
what they share in options.py. Heavy imports (torch, onnxruntime) live inside the commands, so
`tk --help` is instant and `tk translate` never loads torch."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from toolkit import __version__
from toolkit.cli.commands.attention import attention
from toolkit.cli.commands.bench import bench
from toolkit.cli.commands.evaluate import evaluate
from toolkit.cli.commands.export import export
from toolkit.cli.commands.plot import plot
from toolkit.cli.commands.serve import serve
from toolkit.cli.commands.train import train
from toolkit.cli.commands.translate import translate
from toolkit.cli.commands.translate_corpus import translate_corpus
from toolkit.cli.commands.verify import verify
from toolkit.core import signals
from toolkit.core.errors import ToolkitError, describe_os_error, first_line

# What the torch extra installs: the build side (train, export from PyTorch, verify, bench's PyTorch rows).
BUILD_SIDE = ("torch", "onnxscript")


class Group(click.Group):
    """Turns every ToolkitError into one line on stderr and its exit code, never a traceback.

    Ctrl-C and SIGTERM exit 130; an OS error (a full disk, a vanished file) is one line and exit 1;
    anything else is a bug in tk, reported in one line as such (TK_DEBUG=1 shows the traceback).
    """

    def invoke(self, ctx):
        if sys.stdout is None:  # started with stdout closed (`>&-`): whatever it printed would be lost
            if sys.stderr is not None:
                click.echo("error: standard output is closed; reopen it or write to a file (-o FILE where the command has it)", err=True)
            sys.exit(2)
        try:
            with signals.handled():
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
        except BrokenPipeError:
            # The reader went away (`| head -1`): it chose to stop reading, nothing is wrong to report.
            # Python would complain again flushing stdout at exit, so stdout now points at /dev/null.
            with contextlib.suppress(OSError, AttributeError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)  # 128 + SIGPIPE, as a shell reports a process ended by a closed pipe
        except OSError as e:
            if os.environ.get("TK_DEBUG"):
                raise
            click.echo(f"error: {describe_os_error(e)}", err=True)
            sys.exit(1)
        except RecursionError:
            if os.environ.get("TK_DEBUG"):
                raise
            click.echo("error: an input is nested too deeply to read (a corrupt or hostile file?); check the files you gave", err=True)
            sys.exit(2)
        except Exception as e:
            if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in BUILD_SIDE:
                click.echo(f"error: tk {ctx.invoked_subcommand} needs PyTorch, which the base install leaves out; install the torch "
                           "extra: pip install 'tk-onnx-deploy[torch]' (on Linux x86_64, pip install torch==2.13.0 first: the CPU build)",
                           err=True)
                sys.exit(2)
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
