"""Accounting speed and agreement, side by side with dp-accounting and Opacus
(`make bench-accounting`).

Prints a Markdown table: what was computed, by which tool, ε (or σ), and wall time on this
machine. Targets of issue 3: ε for 1e5 composed Poisson-Gaussian steps < 1 s; exact q_E(c)
and ε for N = 60000, batch 256, E = 60, g = 1..8, both samplers < 5 s each; calibration < 10 s.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

logging.getLogger("absl").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SIGMA, Q, STEPS, DELTA = 1.0, 0.004, 100_000, 1e-5
ROWS: list[tuple[str, str, str, float]] = []


def timed(task: str, tool: str, fn: Callable[[], Any], fmt: str = "{:.4f}") -> Any:
    t = time.perf_counter()
    try:
        value = fn()
        text = fmt.format(value)
    except Exception as err:  # a missing optional tool must not stop the benchmark
        value, text = None, f"n/a ({type(err).__name__}: {str(err)[:60]})"
    ROWS.append((task, tool, text, time.perf_counter() - t))
    return value


def poisson_gaussian() -> None:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    from fedpriv.accounting.dpsgd import poisson_gaussian_epsilon

    task = f"eps, {STEPS:.0e} steps, sigma={SIGMA}, q={Q}"
    ev = dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(SIGMA))

    def dpa(acc: Any) -> float:
        acc.compose(ev, STEPS)
        return float(acc.get_epsilon(DELTA))

    def opacus(kind: str) -> float:
        from opacus.accountants import PRVAccountant, RDPAccountant

        acc = RDPAccountant() if kind == "rdp" else PRVAccountant()
        acc.history = [(SIGMA, Q, STEPS)]
        return float(acc.get_epsilon(DELTA))

    timed(
        task,
        "fedpriv pld (auto grid)",
        lambda: poisson_gaussian_epsilon(SIGMA, Q, STEPS, DELTA, "pld"),
    )
    timed(task, "fedpriv rdp", lambda: poisson_gaussian_epsilon(SIGMA, Q, STEPS, DELTA, "rdp"))
    timed(
        task,
        "fedpriv rdp mironov",
        lambda: poisson_gaussian_epsilon(SIGMA, Q, STEPS, DELTA, "rdp", "mironov"),
    )
    timed(task, "dp-accounting pld (1e-4)", lambda: dpa(pld_privacy_accountant.PLDAccountant()))
    timed(task, "dp-accounting rdp", lambda: dpa(rdp_privacy_accountant.RdpAccountant()))
    timed(task, "opacus rdp", lambda: opacus("rdp"))
    timed(task, "opacus prv", lambda: opacus("prv"))


def ledger_runs() -> None:
    from fedpriv.accounting.core.ledger import PrivacyLedger
    from fedpriv.accounting.dpsgd import poisson_gaussian_event

    def ten_runs() -> float:
        ledger = PrivacyLedger()
        for i in range(10):
            ledger.record(poisson_gaussian_event(0.8 + 0.05 * i, 0.01), 100_000)
        return ledger.get_epsilon(DELTA)

    timed("eps, ledger of 10 distinct runs x 1e5 steps", "fedpriv pld (auto grid)", ten_runs)


def calibration() -> None:
    from fedpriv.accounting.dpsgd import calibrate_noise_multiplier

    task = f"calibrate sigma: eps=3, {STEPS:.0e} steps, q={Q}"
    timed(task, "fedpriv pld", lambda: calibrate_noise_multiplier(3.0, DELTA, Q, STEPS, "pld"))
    timed(task, "fedpriv rdp", lambda: calibrate_noise_multiplier(3.0, DELTA, Q, STEPS, "rdp"))

    def opacus(kind: str) -> float:
        from opacus.accountants.utils import get_noise_multiplier

        return float(
            get_noise_multiplier(
                target_epsilon=3.0, target_delta=DELTA, sample_rate=Q, steps=STEPS, accountant=kind
            )
        )

    timed(task, "opacus rdp (get_noise_multiplier)", lambda: opacus("rdp"))
    timed(task, "opacus prv (get_noise_multiplier)", lambda: opacus("prv"))


def skellam_secagg() -> None:
    from fedpriv.accounting.secagg.spec import secagg_dpsgd

    timed(
        "secagg skellam eps, 10 clients, 1e5 steps, 16 bits, d=1e5",
        "fedpriv rdp",
        lambda: secagg_dpsgd(
            "skellam",
            None,
            10,
            Q,
            1000,
            100,
            DELTA,
            accountant="rdp",
            client_noise_multiplier=1.0,
            num_params=100_000,
            bits=16,
        )["epsilon"],
    )


def batch_clipping() -> None:
    from fedpriv.cli.account import run

    for sampling in ("shuffle", "subsample"):
        for num_groups, group_size, label in ((1, 256, "batch clip"), (256, 1, "indiv. clip")):
            for g in range(1, 9):
                params = {
                    "sampling": sampling,
                    "num_samples": "60000",
                    "num_groups": str(num_groups),
                    "group_size": str(group_size),
                    "epochs": "60",
                    "noise_multiplier": "4.0",
                    "group_privacy": str(g),
                    "target_delta": str(DELTA),
                }
                timed(
                    f"q_E + eps, N=60000, {label} 256, E=60, sigma=4, {sampling}, g={g}",
                    "fedpriv batch-clipping",
                    lambda p=params: run("batch-clipping", p)["epsilon"],
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-batch-clipping", action="store_true")
    args = parser.parse_args()
    import opacus.accountants  # noqa: F401  (import time is not accounting time)

    poisson_gaussian()
    ledger_runs()
    calibration()
    skellam_secagg()
    if not args.skip_batch_clipping:
        batch_clipping()
    print("| task | tool | result | seconds |")
    print("|---|---|---|---|")
    for task, tool, text, seconds in ROWS:
        print(f"| {task} | {tool} | {text} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
