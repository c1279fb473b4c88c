"""Record the short-run rows of every case in ``behaviour_400af8e.json`` with the code of
400af8e, for this machine's torch CPU capability (``AVX2``, ``AVX512``, ...).

Old API (before the architecture refactor); run it from a worktree of that commit::

    git worktree add /tmp/base 400af8e
    PYTHONPATH=/tmp/base .venv/bin/python tests/golden/record_rows.py /tmp/rows.json [CASE ...]

then store each case's rows under ``cases.<name>.rounds.<capability>``. Timings are dropped:
a row keeps the keys of the first recording.
"""

import json
import sys
import tempfile
from pathlib import Path

from fedpriv.config import conf_dir, register_schema  # type: ignore[import-not-found]
from fedpriv.runner import run_experiment  # type: ignore[import-not-found]
from hydra import compose, initialize_config_dir

GOLDEN = json.loads((Path(__file__).parent / "behaviour_400af8e.json").read_text())["cases"]
SHARED = str(Path(__file__).resolve().parents[3] / "shared" / "data")
COMMON = ["progress=false", "plot=false", "save_model=false", "ray_init_args.num_cpus=2"]


def overrides(case: dict) -> list[str]:
    given = [*case["overrides"], *case["short_overrides"]]
    return [o.replace("/work/shared/data", SHARED) for o in given] + COMMON


def main(out: Path, names: list[str]) -> None:
    register_schema()
    rows: dict[str, list[dict]] = {}
    for name in names or sorted(GOLDEN):
        case = GOLDEN[name]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides(case))
        with tempfile.TemporaryDirectory() as tmp:
            summary = run_experiment(cfg, Path(tmp) / "run")
        keys = [set(r) for r in next(iter(case["rounds"].values()))]
        rows[name] = [
            {k: v for k, v in r.items() if k in ks} for r, ks in zip(summary["rounds"], keys)
        ]
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
