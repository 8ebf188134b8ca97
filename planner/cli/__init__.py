"""The ``planner`` command: one argparse front, one module per subcommand.

Each subcommand lives in ``planner/cli/cmd_<name>.py`` with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported when the parser is built, so none may import torch at
module level (planning must start fast); heavy imports go inside ``run``.

Data goes to stdout, messages to stderr. Exit codes: 0 done; 1 no feasible plan or a failed
check; 2 bad usage or input; 3 solver stopped before any solution; 70 an internal error (a bug:
one line asking for a report; the traceback with ``--debug`` or ``PLANNER_DEBUG=1``). Expected
errors print one clear message, never a traceback. Every flag is checked by
``planner.cli.flagcheck`` before the command runs.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shlex
import re
import sys
import traceback

from planner.plan.errors import EXIT_BUG, exit_code_for
from costmodel.files.version import tool_version

COMMANDS = ["profile", "plan", "estimate", "explain", "emit", "launch", "replan", "calibrate", "validate"]


# 4-bit training formats a user may ask --dtype for under another name (``_Parser.error``)
FP4_NAMES = ("fp4", "nvfp4", "mxfp4", "e2m1")     # nvfp4: in another case (NVFP4)
FP4_HINT = ("4-bit training is priced as NVFP4, Transformer Engine's recipe (E2M1 values, an E4M3 scale per 16) that "
            "Megatron-LM runs on Blackwell: --dtype nvfp4 --target megatron. MXFP4 training is not priced (Transformer "
            "Engine has no MXFP4 training recipe)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default exits 2 too; one line, with the hint
        asked = re.search(r"argument --dtype: invalid choice: '([^']*)'", message)
        if asked and asked.group(1).lower() in FP4_NAMES:
            message += f". {FP4_HINT}"
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="planner", description="Auto-sharding planner for large models: profile the "
                "hardware, score every parallel split, prove the best one, emit and run it.",
                epilog="Tables and text are for people (they keep every cell when piped). Scripts should "
                "pass --json: one JSON object on stdout, the stable, tested contract. Exit codes: 0 done, "
                "1 no feasible plan or a failed check, 2 bad usage or input, 3 solver stopped first.")
    p.add_argument("--version", action="version", version=f"planner {tool_version()}")
    p.add_argument("--debug", action="store_true", help="on an internal error, print the traceback")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"planner.cli.cmd_{name}")
        except ModuleNotFoundError as e:
            if e.name == f"planner.cli.cmd_{name}":
                continue
            raise
        sp = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(sp)
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an internal error, print the traceback")
        sp.set_defaults(_run=mod.run)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        from planner.cli.flagcheck import check_args
        check_args(args, argv, build_parser)
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # expected errors become one line and their exit code
        code = exit_code_for(e)
        if code is None:
            return _bug(e, args, argv)
        print(f"planner {args.command}: error: {e}", file=sys.stderr)
        return code


def _bug(e: BaseException, args: argparse.Namespace, argv: list[str]) -> int:
    """An exception no check anticipated: a bug. One line asking for a report (exit 70); the
    traceback only with --debug (or PLANNER_DEBUG=1)."""
    if getattr(args, "debug", False) or os.environ.get("PLANNER_DEBUG") not in (None, "", "0"):
        traceback.print_exc()
    what = str(e).splitlines()[0][:200] if str(e) else ""
    print(f"planner {args.command}: internal error ({type(e).__name__}{': ' + what if what else ''}); this is a "
          f"bug in planner {tool_version()}: please report it with the command line `planner {shlex.join(argv)[:500]}` "
          "(rerun with --debug for the traceback)", file=sys.stderr)
    return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
