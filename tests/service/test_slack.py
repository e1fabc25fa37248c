"""The lane rule and the least-slack order (``worker.queue.slack``), pure functions: lanes
are few and tight, the order is least slack first, and a long-window lane's turn comes
before its deadline however much tighter work keeps arriving."""

from __future__ import annotations

import pytest

from worker.protocol.work_estimate import work_estimate
from worker.queue.slack import LaneState, lane_end, lane_width, read_order, slack, work_due_by

NOW = 1_800_000_000.0


@pytest.mark.parametrize("window_h", [0.05, 0.25, 1, 4, 24, 24 * 7, 9999])
def test_a_lane_spans_at_most_an_eighth_of_the_window(window_h: float) -> None:
    window = window_h * 3600
    width = lane_width(window)
    assert width % 60 == 0 and (width // 60) & (width // 60 - 1) == 0  # 60 * 2**k
    assert width <= max(60, window / 8) and (width == 60 or width > window / 16)
    end = lane_end(NOW + window, NOW)
    assert NOW + window <= end < NOW + window + width and end % width == 0


def test_lanes_are_few_at_any_time() -> None:
    """Work published every minute for a day: the lanes still due at the end are about 16
    per window in use at most (a dozen for the 24-hour windows)."""
    end = int(NOW) + 86400
    minutes = range(int(NOW), end, 60)
    assert len({lane_end(t + 86400, t) for t in minutes}) == 12
    mixed = {lane_end(t + w, t) for t in minutes for w in (3600, 4 * 3600, 86400) if t + w > end}
    assert len(mixed) <= 3 * 17


def _lane(name: str, due_in: float, remaining: int, per_entry: float = 100.0,
          undelivered: int | None = None) -> LaneState:
    return LaneState(stream=name, deadline=NOW + due_in, remaining=remaining,
                     undelivered=remaining if undelivered is None else undelivered,
                     work_per_entry=per_entry)


def test_least_slack_first_and_earliest_deadline_without_a_rate() -> None:
    small_soon = _lane("small", 2 * 3600, remaining=1)
    big_later = _lane("big", 3 * 3600, remaining=1000)  # 100,000 tokens
    drained = _lane("drained", 60, remaining=2, undelivered=0)  # all with workers already
    # at 20 tokens/s the big lane needs 5000 s of its 10800: 5800 s to spare, less than 7195
    assert slack(big_later, now=NOW, rate=20.0) == pytest.approx(5800)
    lanes = [small_soon, big_later, drained]
    assert [ln.stream for ln in read_order(lanes, now=NOW, rate=20.0)] == ["big", "small"]
    assert [ln.stream for ln in read_order(lanes, now=NOW, rate=None)] == ["small", "big"]
    assert work_due_by(lanes, NOW + 2 * 3600) == work_due_by([small_soon, drained], NOW + 7200)
    assert work_due_by(lanes, NOW + 3 * 3600).entries == 1003


def test_close_slacks_go_by_deadline_and_hopeless_lanes_after_the_rest() -> None:
    a = _lane("a", 2 * 3600, remaining=110, per_entry=10)  # 1100 s of work: 6100 s to spare
    b = _lane("b", 2 * 3600 - 60, remaining=1)  # 7040 s: a whole quantum more than a ...
    assert [ln.stream for ln in read_order([a, b], now=NOW, rate=1.0)] == ["a", "b"]
    c = _lane("c", 2 * 3600 - 60, remaining=90, per_entry=10)  # ... c: 6240 s, the same one
    assert [ln.stream for ln in read_order([a, c], now=NOW, rate=1.0)] == ["c", "a"]
    hopeless = _lane("h", 600, remaining=100, per_entry=10)  # 1000 s of work in 600 s
    overdue = _lane("o", -60, remaining=1)
    order = read_order([a, hopeless, overdue], now=NOW, rate=1.0)
    assert [ln.stream for ln in order] == ["o", "a", "h"]  # h still takes what a leaves


def test_a_long_window_lane_is_not_starved_by_a_stream_of_tight_ones() -> None:
    """A day-long lane with an hour of work, while a new lane due in 6 hours with 30 minutes
    of work arrives every 30 minutes, for ever: they alone would keep the engine busy. The
    long lane's slack shrinks while the others are served, its turn comes, and it finishes
    before its deadline; the tight lanes, which had slack to give, meet theirs too."""
    rate = 1.0  # tokens per second: a lane's remaining tokens are its remaining seconds
    long = {"deadline": NOW + 86400, "left": 3600.0, "done": 0.0}
    tight: list[dict[str, float]] = []
    t, step, arrivals = NOW, 60.0, NOW
    while t < NOW + 86400:
        while arrivals <= t:
            tight.append({"deadline": arrivals + 6 * 3600, "left": 1800.0, "done": 0.0})
            arrivals += 1800
        lanes = {"long": long, **{f"t{i}": x for i, x in enumerate(tight)}}
        states = [_lane(name, x["deadline"] - NOW, int(x["left"]), 1.0)
                  for name, x in lanes.items() if x["left"] > 0]
        chosen = lanes[read_order(states, now=t, rate=rate)[0].stream]
        chosen["left"] -= step * rate
        t += step
        if chosen["left"] <= 0:
            chosen["done"] = t
    assert 0 < long["done"] <= long["deadline"]
    assert long["done"] > NOW + 12 * 3600  # it waited while it had slack to give
    assert all(x["done"] <= x["deadline"] for x in tight if x["left"] <= 0)
    assert sum(x["left"] > 0 for x in tight) <= 12  # the backlog stays bounded


def test_work_estimate_counts_prompt_and_allowed_output() -> None:
    assert work_estimate({"url": "/v1/completions", "body": {"prompt": "x" * 40}}) == 10 + 16
    assert work_estimate({"url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 5,
                                                             "n": 2}}) == 3 + 10
    chat = {"url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "y" * 8}], "max_tokens": 7}}
    assert work_estimate(chat) == len("user") // 4 + 2 + 7
    assert work_estimate({"url": "/v1/chat/completions", "body": {"messages": []}}) == 256
    assert work_estimate({"body": "not an object"}) == 16
