"""Hydra launcher plugin ``hydra/launcher=ray``: each job of a multirun is a Ray task on an
existing cluster (``ray_init_args.address`` or ``RAY_ADDRESS``); see :mod:`fedpriv.run.sweep`.

Replaces the PyPI ``hydra-ray-launcher`` 1.2.2 (do not install both: they register the same
name), which needs ``ray[default]``, ``boto3`` and ``cloudpickle<3``, forces
``object_store_memory`` into ``ray.init`` (refused when joining a cluster), runs each job
in-process inside a Ray worker (so Flower's simulation would size its actor pool to the whole
cluster) and stops the sweep at the first failed job.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from fedpriv.common.errors import ConfigError


@dataclass
class RayClusterLauncherConf:
    """``hydra.launcher`` options (documented in :class:`fedpriv.run.sweep.ClusterLaunchConfig`)."""

    _target_: str = "hydra_plugins.fedpriv_ray_launcher.ray_cluster_launcher.RayClusterLauncher"
    address: Optional[str] = "${oc.select:ray_init_args.address,null}"
    cpus_per_job: int = 1
    gpus_per_job: float = 0.0
    job_timeout_s: Optional[float] = None
    connect_timeout_s: float = 10.0


ConfigStore.instance().store(
    group="hydra/launcher", name="ray", node=RayClusterLauncherConf, provider="fedpriv"
)


class RayClusterLauncher(Launcher):
    """Launches a batch of Hydra jobs as Ray tasks and waits for all of them."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from fedpriv.run.sweep import ClusterLaunchConfig, JobRecord, launch_on_cluster

        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        if not sweep_dir.is_absolute():  # Ray workers do not run in the caller's directory
            sweep_dir = Path(str(self.config.hydra.runtime.cwd)) / sweep_dir
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs: list[JobRecord] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(sweep_config):
                sweep_config.hydra.job.num = idx
                sweep_config.hydra.job.id = f"ray_{idx}"
            subdir = str(sweep_config.hydra.sweep.subdir)
            jobs.append(
                JobRecord(
                    num=idx,
                    overrides=list(filter_overrides(overrides)),
                    dir=str(sweep_dir / subdir),
                )
            )
        try:
            options = ClusterLaunchConfig(**self.options)
            launch_on_cluster(
                jobs, sweep_dir, str(self.config.hydra.runtime.cwd), options, echo=print
            )
        except (ConnectionError, ConfigError) as exc:  # nothing ran: one line, exit code 2
            print(f"fedpriv: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        if any(job.status == "failed" for job in jobs):
            # every job has run and is recorded (sweep.json); exit 1 without Hydra's traceback
            raise SystemExit(1)
        return [
            JobReturn(
                overrides=j.overrides,
                working_dir=j.dir,
                task_name="fedpriv",
                status=JobStatus.COMPLETED,
                _return_value=j.status,
            )
            for j in jobs
        ]
