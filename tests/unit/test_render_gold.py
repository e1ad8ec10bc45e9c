"""Every sample report through every renderer, compared with tests/gold/."""

from __future__ import annotations

import pytest

from dl2.render import RENDERERS
from goldtest import check_gold
from sample_reports import SAMPLES


@pytest.mark.parametrize("renderer_name", sorted(RENDERERS))
@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_output_matches_gold(sample: str, renderer_name: str) -> None:
    # GIVEN a sample report and a renderer with its default options
    renderer = RENDERERS[renderer_name]()

    # WHEN it renders the report
    text = renderer.render(SAMPLES[sample]())

    # THEN the output is the gold file's, byte for byte
    check_gold(f"{sample}.{renderer.output_file_extension}", text)
