"""The step-time model behind the interactive step budget: a line through the recent
steps' (rows, seconds), forgetting old steps, careful where it cannot read a slope."""

from __future__ import annotations

import pytest

from worker.engine.step_time_model import StepTimeModel


def test_it_reads_the_fixed_and_per_row_time_of_the_steps() -> None:
    model = StepTimeModel()
    for rows in (10, 200, 40, 120, 3, 64, 256, 80):
        model.observe(rows, 0.016 + 0.0025 * rows)
    fixed, per_row = model.fit()
    assert fixed == pytest.approx(0.016) and per_row == pytest.approx(0.0025)
    assert model.rows_within(0.100) == 33  # (100 - 16) / 2.5 ms
    assert model.rows_within(0.010) == 0  # shorter than an empty step


def test_no_estimate_before_a_few_steps_and_empty_steps_teach_nothing() -> None:
    model = StepTimeModel(min_steps=4)
    for rows in (0, 5, 0, 9, 12):
        model.observe(rows, 0.05)
    assert model.fit() is None and model.rows_within(0.1) is None
    model.observe(20, 0.05)
    assert model.rows_within(0.1) is not None


def test_steps_of_one_size_put_the_whole_time_on_the_rows() -> None:
    model = StepTimeModel()
    for _ in range(6):
        model.observe(64, 0.192)
    assert model.fit() == (0.0, pytest.approx(0.003))  # no slope to read: 3 ms a row
    assert model.rows_within(0.096) == 32  # overestimates a smaller step, never a larger one


def test_a_slope_that_reads_negative_falls_back_to_the_mean_rate() -> None:
    model = StepTimeModel(decay=1.0)  # every step weighs the same
    for rows, seconds in ((10, 0.2), (100, 0.1), (10, 0.2), (100, 0.1)):
        model.observe(rows, seconds)
    fixed, per_row = model.fit()
    assert fixed == 0.0 and per_row == pytest.approx(0.15 / 55)


def test_it_follows_the_machine_when_steps_get_slower() -> None:
    model = StepTimeModel(decay=0.8)
    for rows in (10, 100) * 10:
        model.observe(rows, 0.001 * rows)
    for rows in (10, 100) * 10:
        model.observe(rows, 0.004 * rows)  # three quarters of the machine went elsewhere
    assert model.fit()[1] == pytest.approx(0.004, rel=0.05)
