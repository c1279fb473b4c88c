"""One Ray instance shared by the in-process end-to-end runs that can share it (issue 23,
item 7): each run joins it at ``127.0.0.1:<port>`` instead of starting and stopping a local
instance of its own (about 3.5 s a run on this 2-core machine).

A run on an existing cluster sizes its workers by the cluster, not by ``ray_init_args``
(:func:`fedpriv.run.layout.local_actors`), so :func:`run_shared` pins ``num_workers`` to what
the same run would resolve on its own local instance: the rows are those of an unshared run.
Runs that test Ray's own start, stop, reaper or resources keep their own instance. The head
is :func:`fedpriv.run.warm_engine.ray_head` (2 CPUs, as every test run's
``ray_init_args.num_cpus=2``), the one a local sweep's jobs share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest.mock import patch

from omegaconf import DictConfig, open_dict


def run_shared(cfg: DictConfig, out: Path, address: str) -> dict[str, Any]:
    """:func:`fedpriv.run.runner.run_experiment` of ``cfg`` on the shared instance at
    ``address``, with the ``num_workers`` the run resolves on a local instance of its own."""
    from fedpriv.run.prepare import prepare, run_layout
    from fedpriv.run.runner import run_experiment

    assert "RAY_ADDRESS" not in os.environ, "the local layout is resolved without a cluster"
    layout = run_layout(prepare(cfg)[0])
    if not layout.one_node_per_client:
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.num_workers = layout.num_workers
    with patch.dict(os.environ, {"RAY_ADDRESS": address}):
        return run_experiment(cfg, out)
