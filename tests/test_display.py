"""The per-round line: aligned columns at any magnitude, group ε condensed, extras kept."""

from __future__ import annotations

from fedpriv.report.display import HEADER, fixed, format_row

BASE = {
    "server_round": 2,
    "accuracy": 0.074,
    "loss": 0.5,
    "epsilon": 1.99,
    "local_epsilon": None,
    "round_time_s": 7.0,
}


def _columns(line: str) -> list[int]:
    """End positions of the six fixed columns."""
    ends, pos = [], 0
    for width in (5, 8, 8, 8, 9, 8):
        pos += width
        ends.append(pos)
        pos += 2
    return ends


def test_columns_stay_aligned_for_large_values() -> None:
    for loss, eps in ((0.5, 1.99), (121.4944, 7.2), (1810.3, 12345.6), (3.2e7, float("inf"))):
        line = format_row({**BASE, "loss": loss, "epsilon": eps})
        for end in _columns(line):
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), (line, end)
    assert [HEADER[e - 1] for e in _columns(HEADER)] == ["d", "y", "s", "ε", "ε", "]"]
    assert fixed(121.4944, 8, 4) == "121.4944" and fixed(1810.3, 8, 4) == "1.81e+03"


def test_group_epsilons_condensed_and_other_extras_kept() -> None:
    row = {
        **BASE,
        "mean_staleness": 0.5,
        "epsilon_g1": 1.99,
        "epsilon_g1_closed": 1.99,
        "epsilon_g8": 5.951,
        "epsilon_g8_closed": 6.57,
    }
    line = format_row(row)
    assert line.endswith("mean_staleness=0.5  ε g=1,8: 1.99/5.95 (closed form 1.99/6.57)")
    assert "epsilon_g" not in line
    assert (
        format_row({**BASE, "status": "failed", "message": "timeout"})
        == "    2  round failed: timeout"
    )


def test_round_line_says_who_dropped_out() -> None:
    row = {**BASE, "clients_dropped": 1, "dropped": "1 client dropped: non-finite update"}
    line = format_row(row)
    assert line.endswith("   7.00  1 client dropped: non-finite update")
    assert "clients_dropped" not in line
    assert format_row({**BASE, "clients_dropped": 0, "dropped": ""}) == format_row(BASE)
