"""Every session a unit test builds with ``trace_builders`` is also a check of the
incremental model against matching from scratch (``model_agreement``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trace_builders
from model_agreement import check_agreement


@pytest.fixture(autouse=True)
def _model_agrees_on_every_session() -> Iterator[None]:
    trace_builders.OBSERVERS.append(check_agreement)
    yield
    trace_builders.OBSERVERS.remove(check_agreement)
