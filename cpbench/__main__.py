"""``python -m cpbench``: validate the config, run one job (one sweep point), say what it did.

    python -m cpbench                              # probe max N of the reference trunk here
    python -m cpbench routine=timing N=1024 cp=2   # one walltime point
    python -m cpbench -m workflow=training cp=2,4,8 N=1024,2048   # a sweep (validated first)

A config mistake is one line ``cpbench: error: <key>=<value>: <what is allowed>`` on stderr
and exit code 2, before any job starts.

Ctrl-C (SIGINT) or SIGTERM ends the run cleanly: the exception unwinds through the harness, which
kills the point's workers; every finished result.json and the probe's probe_state.json stay; one
line on stderr says what was measured and the command that continues (``resume=true``); exit
code 130 (SIGINT) or 143 (SIGTERM). Only this command line installs the handlers: SLURM tasks
(submitted through submitit) keep the launcher's own SIGTERM handling (``cpbench.sweep.slurm``).
"""

from __future__ import annotations

import os
import signal
import sys

import hydra
from omegaconf import DictConfig

from cpbench.config import ConfigError, check_group_choices, normalize_overrides, register_resolvers
from cpbench.job import interrupt_line, run_job
from cpbench.results import summary

register_resolvers()


def _fail(exc: ConfigError) -> None:
    print(f"cpbench: error: {exc}", file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> str:
    try:
        record = run_job(cfg)
    except ConfigError as exc:
        _fail(exc)
    text = summary(record)
    print(text, flush=True)
    return text


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (``signum``); unwinds like Ctrl-C, so the same cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _leave_now(signum: int, frame) -> None:
    os._exit(128 + signum)  # a second signal during the cleanup: workers die with their parent


def _interrupt(signum: int, frame) -> None:
    signal.signal(signal.SIGINT, _leave_now)
    signal.signal(signal.SIGTERM, _leave_now)
    raise Interrupted(signum)


def cli() -> None:
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.argv[1:] = normalize_overrides(sys.argv[1:])
    try:
        try:
            check_group_choices(sys.argv[1:])
        except ConfigError as exc:
            _fail(exc)
        main()
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        sys.stdout.flush()
        name = signal.Signals(signum).name
        try:
            line = interrupt_line(name, sys.argv[1:])
        except Exception as err:  # noqa: BLE001 - the exit must stay one line
            line = f"cpbench: interrupted by {name} ({type(err).__name__} while listing what was measured)"
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None


if __name__ == "__main__":
    cli()
