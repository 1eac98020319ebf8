"""Fixtures the test files share."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Runs the test on one intra-op thread (the hook's tests compare
    against plain training bit for bit, and time steps), then restores the
    thread count. Files take it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
