"""
How every script talks to its user when something is wrong: one line that names the problem and
what to do, never a traceback. Exit codes: 2 for usage (bad flags, missing or malformed files,
a refused action), 1 for a failed check (verify.py's FAIL) or a broken run. bench.py exits 0
for every verdict it records, a FAIL among them: the verdict is its output.
"""
import argparse
import os
import re
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`script: error: ...`, exit 2), not its usage block
    followed by the error, and which names a mistyped flag before a missing required one
    (`export.py --ot x` is about --ot, not about the --out it lacks; the same for a
    subcommand's: `kernelbench.py score --bogus`)."""

    def parse_args(self, args=None, namespace=None):
        listed = sys.argv[1:] if args is None else list(args)
        if "-h" in listed or "--help" in listed:  # the usage shows required flags as required
            return super().parse_args(args, namespace)
        required = list(_required_actions(self))
        for action in required:
            action.required = False
        try:
            _, unknown = self.parse_known_args(args, namespace)
        finally:
            for action in required:
                action.required = True
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(args, namespace)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def _required_actions(parser):
    """The required arguments of a parser and of its subcommands' parsers."""
    for action in parser._actions:
        if action.required:
            yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _required_actions(sub)


class UsageError(Exception):
    """Bad flags, files or state. The message is the whole story: one line, ends with what to do.
    `code` is the exit status (2 unless the caller says otherwise)."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def one_line(error, limit=300) -> str:
    """An exception or text as one line. Multi-line messages (Triton's CompilationError puts a
    source excerpt between its first and last line) keep their first and last lines; an
    exception whose message is empty is named by its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        text = type(error).__name__ if isinstance(error, BaseException) else ""
    elif len(lines) == 1:
        text = lines[0]
    else:
        text = f"{lines[0]} ... {lines[-1]}"
    text = re.sub(r"[\t\r\x00-\x1f]+", " ", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(error, limit=300) -> str:
    """`Type: message` on one line, for errors raised by code we do not own (a kernel, a model)."""
    text = one_line(error, limit)
    name = type(error).__name__
    return name if text == name else f"{name}: {text}"


def fail(script, message, code=2) -> int:
    """Print `script: error: message` on stderr and return the exit code to pass on."""
    print(f"{script}: error: {one_line(message, 2000)}", file=sys.stderr)
    return code


def run_main(script, main, argv=None) -> int:
    """Run a script's main(argv), turning a UsageError into its one-line message and exit code,
    Ctrl-C into a quiet exit 130, and a closed stdout (`| head`) into a quiet exit 141 (the
    shell's code for SIGPIPE)."""
    try:
        return main(argv) or 0
    except UsageError as e:
        return fail(script, e, e.code)
    except KeyboardInterrupt:
        print(f"{script}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python flushes stdout again at exit, which would raise once more: point it at devnull.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
