"""Build pfl 0.6.0's banded matrix factorization exactly as pfl deploys it; save it to .npy.

Run with the pfl venv (``$PFL_PY``), never the project's. For each (n, b) it constructs pfl's own
``pfl.privacy.ftrl_mechanism.BandedMatrixFactorizationMechanism(clipping_bound=1, num_iterations=n,
min_separation=b, make_privacy_accountant)`` (inside a scratch working directory, since pfl writes
``./banded_mf_dp_ftrl/query_matrix.npy``), and saves to OUT_DIR/pfl_n{n}_b{b}_*.npy:

* ``C``: ``mechanism.query_matrix`` (pfl's "query matrix" = ``np.linalg.cholesky(X)``, line 208),
* ``M``: the matrix that actually generates the noise. pfl's ``add_noise`` adds, in round i,
  ``ForwardSubstitution(C).step(z_i)`` = row i of ``C^{-1} Z`` (lines 216-217, 254), so
  ``M = C^{-1}`` (checked here by running pfl's ``ForwardSubstitution`` on unit noise),
* ``X``: the Gram matrix pfl's optimiser returned (``FTRLMatrixFactorizer.optimize``), recovered
  as ``C C^T`` (that is what ``np.linalg.cholesky`` guarantees: ``L L^T = X``).

and a JSON with pfl's sensitivity assumption: its accountant is built by
``make_privacy_accountant(max_participation)`` with ``max_participation = ceil(n/b)`` (lines
181-184), i.e. ``k`` compositions of a Gaussian mechanism of per-participation sensitivity
``clipping_bound`` (the optimiser keeps ``diag(X) = 1``, bridge/pytorch/ftrl.py line 45), so pfl
assumes squared sensitivity ``k * max diag(X) = k`` (sensitivity sqrt(k)) for the whole run.
Also pfl's calibrated noise multiplier for ε = 3, δ = 1e-5 with its PLD accountant, for
``sampling_probability = 1`` (no amplification: the fixed ``minimize_reuse`` cycle) and for
``cohort/population = 0.02`` (the convention of pfl-research's benchmarks, which passes
``sampling_probability=max_cohort_size / population`` to the banded MF accountant).

Usage: pfl_matrix_sensitivity.py OUT_DIR [n:b ...]   (default 500:50 100:10 16:4)
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cases = [tuple(int(v) for v in a.split(":")) for a in sys.argv[2:]] or [
        (500, 50), (100, 10), (16, 4)
    ]  # fmt: skip

    from pfl.internal.ops import get_ops, pytorch_ops
    from pfl.internal.ops.selector import set_framework_module

    set_framework_module(pytorch_ops)  # what pfl.model.pytorch.PyTorchModel does (line 94)
    from pfl.privacy import PLDPrivacyAccountant
    from pfl.privacy.ftrl_mechanism import BandedMatrixFactorizationMechanism, ForwardSubstitution

    summary = {}
    for n, b in cases:
        k_seen = []

        def make_acc(num_compositions: int, q: float = 1.0) -> PLDPrivacyAccountant:
            k_seen.append(num_compositions)  # noqa: B023 (used before the loop moves on)
            return PLDPrivacyAccountant(
                num_compositions, sampling_probability=q, mechanism="gaussian",
                epsilon=3.0, delta=1e-5,
            )  # fmt: skip

        cwd = os.getcwd()
        with tempfile.TemporaryDirectory() as scratch:
            os.chdir(scratch)
            t0 = time.perf_counter()
            mech = BandedMatrixFactorizationMechanism(
                clipping_bound=1.0, num_iterations=n, min_separation=b,
                make_privacy_accountant=make_acc,
            )  # fmt: skip
            secs = time.perf_counter() - t0
            os.chdir(cwd)
        k = k_seen[0]
        c = np.asarray(mech.query_matrix, dtype=np.float64)
        x = c @ c.T  # the X pfl's optimiser returned (cholesky: L L^T = X)
        m = np.linalg.inv(c)
        # The noise pfl adds: run its own ForwardSubstitution on the identity's columns.
        fs = ForwardSubstitution(mech.query_matrix, b - 1)
        eye = np.eye(n, dtype=np.float32)
        m_pfl = np.stack([get_ops().to_numpy(fs.step(eye[i])) for i in range(n)])
        fs_err = float(np.abs(m_pfl - m).max() / np.abs(m).max())
        q_bench = 120 / 6000
        sigma_q1 = float(mech.relative_noise_stddev)
        sigma_bench = float(make_acc(k, q_bench).cohort_noise_parameter)
        tag = f"pfl_n{n}_b{b}"
        np.save(out / f"{tag}_C.npy", c)
        np.save(out / f"{tag}_M.npy", m)
        np.save(out / f"{tag}_X.npy", x)
        row_sq, col_sq = (c**2).sum(1), (c**2).sum(0)
        info = {
            "n": n,
            "min_separation": b,
            "pfl_max_participation_k": k,
            "pfl_mask_bandwidth": b - 1,
            "X_nonzero_max_offset": int(
                max(abs(i - j) for i, j in zip(*np.nonzero(np.abs(x) > 1e-6)))
            ),
            "X_diag_min_max": [float(np.diag(x).min()), float(np.diag(x).max())],
            "X_min_entry": float(x.min()),
            "C_is_lower_triangular": bool(not np.triu(c, 1).any()),
            "C_row_sq_norms_min_max": [float(row_sq.min()), float(row_sq.max())],
            "C_col_sq_norms_min_max": [float(col_sq.min()), float(col_sq.max())],
            "forward_substitution_vs_inv_C_rel_err": fs_err,
            "pfl_assumed_sensitivity_squared": float(k * np.diag(x).max()),
            "pfl_assumed_sensitivity": math.sqrt(k * float(np.diag(x).max())),
            "pfl_sigma_eps3_q1": sigma_q1,
            "pfl_sigma_eps3_q0.02_benchmark_convention": sigma_bench,
            "factorization_seconds": secs,
            "C_dtype_pfl": str(mech.query_matrix.dtype),
        }
        summary[tag] = info
        print(json.dumps({tag: info}), flush=True)
    (out / "pfl_matrices.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
