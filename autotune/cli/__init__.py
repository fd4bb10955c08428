"""The `autotune` command. Each sub-command lives in its own module with a `register(subparsers)`.

User errors (AutotuneError subclasses of UserError, argparse mistakes) print one line on stderr
and exit 2, never a traceback (house rule 7). Heavy imports happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys

from autotune import __version__
from autotune.errors import UserError

COMMAND_MODULES = ("_space_cmds", "_estimate_cmd", "_study_cmds", "_export_cmd", "_db_cmds", "_trace_cmds",
                   "_dashboard_cmd")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from autotune._paths import one_line

        # argparse quotes what it refused as given: an ESC or a newline in a flag reached the terminal raw (review)
        message = one_line(message + self._hint(message))
        # argparse quotes the value it could not use whole: a 5,000-digit number was 5,000 characters of error
        # (found by an adversarial pass); the start of it says which value
        if len(message) > ERROR_MAX_CHARS:
            message = f"{message[:ERROR_MAX_CHARS - 60]}... ({len(message):,} characters)"
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)

    def _hint(self, message: str) -> str:
        """For an unknown flag: the flag it is most like, or where a knob goes on a command that pins knobs with
        --fix (found by a new-user pass: `start --tp 2` and `--budjet 3` got a bare "unrecognized arguments")."""
        import difflib

        if not message.startswith("unrecognized arguments: "):
            return ""
        words = message.removeprefix("unrecognized arguments: ").split()
        at = next((i for i, word in enumerate(words) if word.startswith("--")), None)
        if at is None:
            return ""
        flag, _, value = words[at].partition("=")
        own = [option for option in self._option_string_actions if option.startswith("--")]
        from autotune.config import BOOL_KNOBS, KNOBS

        knob = flag[2:].replace("-", "_")
        if "--fix" in own and knob in KNOBS:  # a layout knob (performance knobs are the knob phase's, not --fix's)
            if not value:
                following = words[at + 1] if at + 1 < len(words) else ""
                value = following if following and not following.startswith("-") else (
                    "true" if knob in BOOL_KNOBS else "VALUE")
            return f" (a layout knob is pinned with --fix: --fix {knob}={value})"
        close = difflib.get_close_matches(flag, own, n=1, cutoff=0.75)
        return f" (did you mean {close[0]}?)" if close else ""


ERROR_MAX_CHARS = 300  # of a usage error's message


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = OneLineParser(prog="autotune", description="Tune Megatron-Bridge parallel layouts.")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=OneLineParser)
    parser.commands = sub.choices  # the commands' own parsers, by name (main's unknown-flag error)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"autotune.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"autotune.cli.{name}":
                continue  # a command module not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    for name in ("COLUMNS", "LINES"):  # rich reads them with str.isdigit() and int(): '²' passes one, fails the other
        value = os.environ.get(name)
        if value is not None and not (value.isascii() and value.isdigit()):
            del os.environ[name]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser: its name, and a hint from its own flags
        commands = getattr(parser, "commands", {})
        commands.get(getattr(args, "subcommand", None), parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        sys.stderr.write(f"autotune {args.subcommand}: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt as exc:
        from autotune._signals import Terminated

        terminated = isinstance(exc, Terminated)
        sys.stderr.write(f"autotune: interrupted{' (SIGTERM)' if terminated else ''}\n")
        return 143 if terminated else 130
    except BrokenPipeError as exc:
        import os

        from autotune.errors import OutputClosed

        # the reader went (`| head`): no more output, and none at exit (Python's flush would complain)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if isinstance(exc, OutputClosed):  # a study stopped with it: say so, as after Ctrl-C
            sys.stderr.write(f"autotune {args.subcommand}: interrupted (its output was closed); "
                             + ("`autotune resume` continues the study\n" if exc.stored else
                                "no study was stored\n"))
            return 141  # 128 + SIGPIPE, as a shell reports a pipeline's writer stopped by it
        return 0  # the output was all that was lost (a study that had ended stays finished)
    except Exception as exc:  # after the clauses above: a `raise` here reaches none of them
        failure = _store_failure(exc)
        if failure is None:
            raise
        sys.stderr.write(f"autotune {args.subcommand}: error: {failure}\n")
        return 2


def _store_failure(exc: BaseException) -> str | None:
    """One line for a database error that reached the top through Optuna's storage (our own Repository wraps
    its errors as StorageError), None for anything else. Found by the storage pass: a table of another
    application named `trials` made Optuna's first query a page of chained tracebacks."""
    import traceback

    optuna = sys.modules.get("optuna")
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    kinds = tuple(k for k in (getattr(getattr(optuna, "exceptions", None), "StorageInternalError", None),
                              getattr(sqlalchemy_exc, "SQLAlchemyError", None)) if k is not None)
    if not kinds or not isinstance(exc, kinds):
        return None
    # only an error raised inside Optuna's package: one from autotune's own code is a bug, and keeps its
    # traceback (review: an IntegrityError the repository lets through was labelled Optuna's)
    if not any("/optuna/" in frame.filename.replace("\\", "/") for frame in traceback.extract_tb(exc.__traceback__)):
        return None
    from autotune._paths import one_line

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    words = str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__]
    return f"the store failed (in Optuna's storage): {one_line(words[0])[:200]}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
