"""Fixtures of the local end-to-end tests."""
from __future__ import annotations

import pytest

from tests.helpers import assert_no_survivors, run_cli


@pytest.fixture
def cleanup():
    """Clusters to take down (if left up) and check for survivors at the end of a test:
    ``cleanup(name, state_dir)``."""
    names: list[tuple[str, object]] = []
    yield lambda name, state_dir: names.append((name, state_dir))
    for name, state_dir in names:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir)
    for name, _ in names:
        assert_no_survivors(name)

