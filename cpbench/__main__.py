"""``python -m cpbench``: validate the config, run one job (one sweep point), say what it did.

    python -m cpbench                              # probe max N of the reference trunk here
    python -m cpbench routine=timing N=1024 cp=2   # one walltime point
    python -m cpbench -m workflow=training cp=2,4,8 N=1024,2048   # a sweep (validated first)

A config mistake is one line ``cpbench: error: <key>=<value>: <what is allowed>`` on stderr
and exit code 2, before any job starts.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from cpbench.config import ConfigError, check_group_choices, register_resolvers
from cpbench.job import run_job
from cpbench.results import summary

register_resolvers()


def _fail(exc: ConfigError) -> None:
    print(f"cpbench: error: {exc}", file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(2)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> str:
    try:
        record = run_job(cfg)
    except ConfigError as exc:
        _fail(exc)
    text = summary(record)
    print(text, flush=True)
    return text


def cli() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except ConfigError as exc:
        _fail(exc)
    main()


if __name__ == "__main__":
    cli()
