"""The ``trimtab`` command line: ``info``, ``train``, ``report``, ``eval`` and ``sweep``.

Errors a user can fix (bad data, config, run directory, checkpoint) print as one line, without
a traceback, and exit 2; a sentinel halt exits 3."""

from __future__ import annotations

import argparse
import contextlib
import platform
import signal
import sys
from collections.abc import Sequence

from trimtab import __version__


def _info(_: argparse.Namespace) -> int:
    import torch

    from trimtab._impl import interpreter_enabled, triton_available

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    triton = "not installed"
    if triton_available():
        import triton as _triton

        triton = _triton.__version__
    print(f"trimtab {__version__}")
    print(f"python  {platform.python_version()}")
    print(f"torch   {torch.__version__}")
    print(f"triton  {triton}{' (interpreter)' if interpreter_enabled() else ''}")
    print(f"cuda    {cuda}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trimtab",
        description="Adaptive stability bounds and a sync-free NaN sentinel for deep Q-learning.",
    )
    parser.add_argument("--version", action="version", version=f"trimtab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print versions and the devices trimtab can use")
    info.set_defaults(func=_info)
    from trimtab.rl.run.cli import add_commands

    add_commands(sub)
    from trimtab.rl.sweep.cli import add_command as add_sweep

    add_sweep(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``docker stop``, ``kill``), raised where Ctrl-C's KeyboardInterrupt
    would be, so a run stops the same way: its message, the checkpoints kept, the resume
    command."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    from trimtab.rl.run.cli import TRAINER_DEPENDENCIES, user_errors

    terminated: list[int] = []

    def on_sigterm(signum: int, frame: object) -> None:
        terminated.append(signum)
        raise Terminated("terminated (SIGTERM)")

    previous = None
    with contextlib.suppress(ValueError):  # the main thread only (a test may call main() elsewhere)
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return int(args.func(args))
    except user_errors() as e:
        print(f"trimtab: error: {e}", file=sys.stderr)
        return 2
    except _halted() as e:
        print(f"trimtab: halted: {e}", file=sys.stderr)
        return 3
    except ModuleNotFoundError as e:  # the library alone installed: the trainer needs its extra
        if (e.name or "").split(".")[0] not in TRAINER_DEPENDENCIES:
            raise
        print(
            f"trimtab: error: `trimtab {args.command}` needs the trainer's dependencies "
            f"({e.name} is not installed): pip install 'trimtab[train]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as e:  # a run's own says where it was and what a resume redoes
        why = "terminated (SIGTERM): " if terminated and not isinstance(e, Terminated) else ""
        print(f"trimtab: {why}{e or 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130  # 128 + the signal, as a shell reports it
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _halted() -> type[BaseException]:
    from trimtab.rl.train import TrainingHalted

    return TrainingHalted


if __name__ == "__main__":
    sys.exit(main())
