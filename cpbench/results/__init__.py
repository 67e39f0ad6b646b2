"""The on-disk contract: ``result.json`` (``record``), ``probe_state.json`` (``probe_state``) and
the one-line summaries people read (``text``). The schema is the docstring of ``record``.

The harness writes these files and the report reads them; nothing here imports either.
"""

from cpbench.results.probe_state import (
                                         INCOMPLETE,
                                         PROBE_STATE_FILE,
                                         incomplete_probe,
                                         iter_incomplete_probes,
                                         without_continued_probes,
)
from cpbench.results.record import (
                                         RESULT_FILE,
                                         SCHEMA_VERSION,
                                         STATUSES,
                                         code_version,
                                         find_previous,
                                         iter_results,
                                         max_over_ranks,
                                         point_signature,
                                         read_json,
                                         schema_error,
                                         write_json_atomic,
)
from cpbench.results.text import one_line, start_line, summary

__all__ = ["INCOMPLETE", "PROBE_STATE_FILE", "RESULT_FILE", "SCHEMA_VERSION", "STATUSES", "code_version",
           "find_previous", "incomplete_probe", "iter_incomplete_probes", "iter_results", "max_over_ranks",
           "one_line", "point_signature", "read_json", "schema_error", "start_line", "summary",
           "without_continued_probes", "write_json_atomic"]
