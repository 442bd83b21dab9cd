"""The `tk` command line: the group and its error handling here, one module per command in commands/,
what they share in options.py. Heavy imports (torch, onnxruntime) live inside the commands, so
`tk --help` is instant and `tk translate` never loads torch."""

# ruff: noqa: E402 (the signal handlers are installed before the other imports, on purpose)
from __future__ import annotations

# First, before the imports below (53 ms of them, and each command's own after): a Ctrl-C or SIGTERM while tk starts
# exits 130 with one line. Python's own handler would print a KeyboardInterrupt traceback, and SIGTERM's would kill
# the process with 143; the module imports only the standard library. Put back at the end of this module (an
# in-process import leaves its caller as it was); Group.main installs it again for the command's whole run.
from toolkit.core import signals

_STARTUP = signals.exit_at_once()

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
from toolkit.core import atomic
from toolkit.core.errors import ToolkitError, describe_os_error, first_line, os_error_exit_code

# What the torch extra installs: the build side (train, export from PyTorch, verify, bench's PyTorch rows).
BUILD_SIDE = ("torch", "onnxscript")


class Group(click.Group):
    """Turns every ToolkitError into one line on stderr and its exit code, never a traceback.

    Ctrl-C and SIGTERM exit 130; an OS error is one line, exit 2 where the path given is at fault (permission
    denied, a vanished file) and 1 where the machine is (a full disk);
    anything else is a bug in tk, reported in one line as such (TK_DEBUG=1 shows the traceback).
    """

    def main(self, *args, **kwargs):
        # From the first line the group runs to its last: a signal outside a command's handled() block (parsing the
        # arguments, the exit) exits 130 at once, as during start-up; handled() raises KeyboardInterrupt inside it.
        with signals.starting():
            return super().main(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        # The process's entry (the tk script, python -m toolkit.cli; in-process callers such as CliRunner call main):
        # a signal outside the command exits 130 at once, from before main to the interpreter's exit (joining threads,
        # where Python's own handler would print "Exception ignored in threading._shutdown ... KeyboardInterrupt").
        # Installed before main, so main's starting() puts back this handler, not the default one: installed only after
        # it, a third Ctrl-C landing between the two ended the process by SIGINT after "error: interrupted" (CI).
        signals.exit_at_once()
        try:
            return self.main(*args, **kwargs)
        finally:
            signals.exit_at_once()  # again, should the command have left a library's handler in place

    def invoke(self, ctx):
        if sys.stdout is None:  # started with stdout closed (`>&-`): whatever it printed would be lost
            if sys.stderr is not None:
                click.echo("error: standard output is closed; reopen it or write to a file (-o FILE where the command has it)", err=True)
            sys.exit(2)
        try:
            try:
                with signals.handled():
                    return super().invoke(ctx)
            finally:
                atomic.abort_unfinished()  # an output interrupted as it was opened, before its owner could abort it
        except ToolkitError as e:
            if signals.interrupted() and e.exit_code != 130:  # raised because of the signal (see below): say that
                signals.say_interrupted()
                sys.exit(130)
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            signals.say_interrupted()
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
            sys.exit(os_error_exit_code(e))  # 2 where the path given is at fault (permission denied), 1 for a full disk
        except RecursionError:
            if os.environ.get("TK_DEBUG"):
                raise
            click.echo("error: an input is nested too deeply to read (a corrupt or hostile file?); check the files you gave", err=True)
            sys.exit(2)
        except Exception as e:
            if signals.interrupted() and not os.environ.get("TK_DEBUG"):
                # The signal was raised inside code that turned it into another error (a native module's import
                # says "ImportError: initialization failed", which a runtime's loader may report as a ToolkitError
                # above): the cause is the interruption, not a fault of tk's or the user's.
                signals.say_interrupted()
                sys.exit(130)
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

signals.restore(_STARTUP)
