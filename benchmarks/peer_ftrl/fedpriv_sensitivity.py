"""fedpriv's sensitivity of the matrix pfl 0.6.0 actually deploys (run with the project's venv).

Loads ``pfl_n{n}_b{b}_M.npy`` (the noise-generating matrix: pfl adds row i of ``M Z`` in round
i, ``M = C^{-1}`` with ``C = np.linalg.cholesky(X)``) and ``pfl_matrices.json`` written by
``pfl_matrix_sensitivity.py`` (pfl venv), and computes with fedpriv's own code:

* ``gram_real = fedpriv.mechanisms.mf_sensitivity.gram_from_noise_matrix(M)`` (= ``C^T C``),
* ``sensitivity_squared(gram_real, Participation(min_separation, k, b))`` (upper bound; exact
  when the Gram is zero beyond b-1 off-diagonals, checked here, and nonnegative),
* the same for the Gram pfl optimised (``X = C C^T``), which is what pfl's accountant describes,
* ``brute_force_sensitivity_squared`` for n <= 16,
* ε at δ = 1e-5 (dp_accounting PLD, add/remove, as pfl's accountant) of one Gaussian mechanism
  with noise multiplier ``σ / sens`` for pfl's calibrated σ (q = 1): assumed vs real.

Usage: fedpriv_sensitivity.py MATRIX_DIR [MATRIX_DIR ...] [--out=JSON]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from dp_accounting import GaussianDpEvent
from dp_accounting.pld import PLDAccountant

from fedpriv.mechanisms.mf_sensitivity import (
    brute_force_sensitivity_squared,
    gram_from_noise_matrix,
    sensitivity_squared,
)
from fedpriv.mechanisms.participation import Participation

DELTA = 1e-5


def pld_epsilon(noise_multiplier: float) -> float:
    acc = PLDAccountant()
    acc.compose(GaussianDpEvent(noise_multiplier))
    return float(acc.get_epsilon(DELTA))


def sigma_for_epsilon(target: float, sens: float) -> float:
    """Smallest σ (per unit clip) with ε(σ/sens) <= target (bisection)."""
    lo, hi = 0.1, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pld_epsilon(mid / sens) <= target else (mid, hi)
    return hi


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    results = {}
    for d in dirs:
        meta = json.loads((d / "pfl_matrices.json").read_text())
        for tag, info in meta.items():
            n, b, k = info["n"], info["min_separation"], info["pfl_max_participation_k"]
            part = Participation(kind="min_separation", max_participations=k, min_separation=b)
            m = np.load(d / f"{tag}_M.npy")
            c = np.load(d / f"{tag}_C.npy")
            gram_real = gram_from_noise_matrix(m)
            gram_pfl = gram_from_noise_matrix(np.linalg.inv(c.T))  # (C^T)^-1 -> C C^T = X
            off = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
            s2_real = sensitivity_squared(gram_real, part)
            s2_opt = sensitivity_squared(gram_pfl, part)
            s2_assumed = info["pfl_assumed_sensitivity_squared"]
            sigma = info["pfl_sigma_eps3_q1"]
            row = {
                "n": n,
                "min_separation": b,
                "k": k,
                "gram_real_zero_beyond_offset_b-1": bool(np.abs(gram_real[off >= b]).max() < 1e-9),
                "gram_real_min_entry": float(gram_real.min()),
                "gram_real_max_abs_diff_from_pfl_X": float(np.abs(gram_real - gram_pfl).max()),
                "gram_real_diag_min_max": [
                    float(gram_real.diagonal().min()),
                    float(gram_real.diagonal().max()),
                ],
                "pfl_assumed_sensitivity": math.sqrt(s2_assumed),
                "fedpriv_sensitivity_of_pfl_optimised_X": math.sqrt(s2_opt),
                "fedpriv_sensitivity_of_deployed_matrix": math.sqrt(s2_real),
                "ratio_real_over_assumed": math.sqrt(s2_real / s2_assumed),
                "pfl_sigma_eps3_q1": sigma,
                "epsilon_pfl_claims": pld_epsilon(sigma / math.sqrt(s2_assumed)),
                "epsilon_real": pld_epsilon(sigma / math.sqrt(s2_real)),
                "sigma_needed_for_eps3_with_deployed_matrix": sigma_for_epsilon(
                    3.0, math.sqrt(s2_real)
                ),
                "delta": DELTA,
            }
            if n <= 16:
                row["brute_force_sensitivity_of_deployed_matrix"] = math.sqrt(
                    brute_force_sensitivity_squared(gram_real, part)
                )
                row["brute_force_sensitivity_of_pfl_optimised_X"] = math.sqrt(
                    brute_force_sensitivity_squared(gram_pfl, part)
                )
            results[tag] = row
            print(json.dumps({tag: row}), flush=True)
    if "out" in opts:
        Path(opts["out"]).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
