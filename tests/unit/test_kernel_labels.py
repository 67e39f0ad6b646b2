"""Backend labels (``flex+triton+tattn``): what the report writes for a point is what the GPU
scripts select from it (``kernels.choices_of``), and a label with an unknown part is refused."""

from __future__ import annotations

import pytest

from cpbench.models.pairformer.ops import kernels
from cpbench.report.rows import kernels_of


@pytest.mark.parametrize("stats", [{}, {"passes": "triton"}, {"passes": "triton", "attention": "triton"},
                                   {"attention": "triton"}])
def test_the_report_label_names_the_choices_that_ran(stats):
    label = kernels_of({"stats": {"kernels": "flex", **stats}, "point": {"workflow": "inference"}}, {})
    assert kernels.choices_of(label) == {"kernels": "flex", "passes": stats.get("passes", "inductor"),
                                         "attention": stats.get("attention", "auto")}


def test_an_unknown_part_is_refused():
    with pytest.raises(kernels.KernelError, match="flex\\+cutlass"):
        kernels.choices_of("flex+cutlass")
