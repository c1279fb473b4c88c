"""Every DP-FTRL strategy side by side: sensitivity, prefix-sum error and noise memory.

For n rounds and a participation pattern (default: 10 participations, n/10 rounds apart, as
10 epochs over the clients; ``--single`` for one participation), each strategy of
``privacy.factorization`` is built as a run builds it (optimised, cached on disk) and the table
gives its analytic sensitivity, the sensitivity of the MATERIALISED noise matrix of its stream
(n <= 2,000), the RMSE and the largest error of the n prefix sums at unit effective noise
(noise std = the pattern's sensitivity: equal ε for every row without amplification), the noise
vectors its stream holds and the seconds it took to build.

Usage::

    .venv/bin/python scripts/ftrl_strategies.py --rounds 100 1000 2000
    .venv/bin/python scripts/ftrl_strategies.py --rounds 500 --single --skip dense
"""

from __future__ import annotations

import argparse
import time

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.mf_catalog import FactorizationKind, make_factorization
from fedpriv.mechanisms.participation import Participation

#: Above this many rounds the materialised check is skipped (as a run does past 4,096).
MATERIALIZE_MAX = 2000


def pattern_for(num_rounds: int, single: bool) -> Participation:
    """One participation, or 10 participations n/10 rounds apart."""
    if single:
        return Participation(kind="single")
    b = max(1, num_rounds // 10)
    return Participation(kind="min_separation", max_participations=10, min_separation=b)


def row(kind: FactorizationKind, n: int, pattern: Participation) -> str:
    """One Markdown row for ``kind`` at ``n`` rounds."""
    t0 = time.monotonic()
    bands = min(n, pattern.separation) if pattern.kind != "single" else min(n, 32)
    f = make_factorization(kind, n, pattern, bands, 4)
    built = time.monotonic() - t0
    sens = f.analytic_sensitivity(pattern, n)
    mat = f.materialized_sensitivity(pattern, n) if n <= MATERIALIZE_MAX else float("nan")
    rmse = f.workload_error(pattern, n)
    worst = f.max_workload_error(pattern, n)
    return (
        f"| {kind.value} | {n} | {sens:.4f} | {mat:.4f} | {rmse:.3f} | {worst:.3f} | "
        f"{f.noise_vectors(n)} | {built:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", nargs="*", type=int, default=[100, 1000, 2000])
    parser.add_argument("--single", action="store_true", help="one participation per client")
    kinds = [k.value for k in FactorizationKind]
    parser.add_argument("--skip", nargs="*", default=[], choices=kinds)
    args = parser.parse_args()
    print(
        "| strategy | n | sensitivity | materialised | prefix RMSE | max error | "
        "noise vectors | build s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.rounds:
        pattern = pattern_for(n, args.single)
        for kind in FactorizationKind:
            if kind.value in args.skip:
                continue
            try:
                print(row(kind, n, pattern), flush=True)
            except ConfigError as exc:  # e.g. dense with several participations past 500
                print(f"| {kind.value} | {n} | refused: {exc} |||||| |", flush=True)


if __name__ == "__main__":
    main()
