"""The performance code is tested where commands use it: each test runs as a command does, inside
``rlhfkit.accel.switched`` under the mode the environment sets (``auto`` unless ``RLHFKIT_ACCEL=0``), so the
faster implementations stand in for the models' plain functions."""

import pytest

from rlhfkit import accel


@pytest.fixture(autouse=True)
def as_a_command():
    with accel.switched(accel.mode_from_environment()):
        yield
