"""The run's Ray instance (Flower's simulation backend), started before anything is written.

fedpriv calls ``ray.init`` itself, before Flower's Ray backend would (Flower skips its own
call when Ray is initialized), so that every start-up fault ends in one line within seconds
instead of a wait for ``round_timeout``:

* an address where no Ray cluster listens: refused within ``ray_connect_timeout_s`` (a TCP
  probe of ``host:port``, then ``ray.init`` itself under the same deadline);
* an unknown ``ray_init_args`` key: named;
* ``client_resources`` that no node of the instance can hold (``num_gpus=1`` on a machine
  without a GPU, ``num_cpus=100`` on 16 CPUs): named, with the instance's resources, since
  Ray would otherwise queue the client actors forever.

A killed run (SIGKILL: nothing of it runs any more) must not leave Ray behind: a reaper
process (:func:`reap_when_gone`, started once per process, in its own session so that a
Ctrl-C to the terminal's process group leaves it alone) watches the run's process and, once
it is gone, kills what was its process tree (Ray's GCS, raylet, agents and actors).

``ray.init`` replaces the process's SIGTERM handler by one that exits at once; the runner
installs its own handler after :func:`start_ray` (``fedpriv.run.runner._graceful_stop``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from fedpriv.common.errors import ConfigError


def running_ray() -> Any:
    """The ``ray`` module when this process is connected to a Ray instance (a driver that
    started or joined one, or a Ray worker), else ``None``; never imports Ray."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def start_ray(init_args: dict[str, Any], client_resources: dict[str, Any], timeout: float) -> None:
    """Start (or join) the run's Ray instance and check that a client actor fits in it.

    Parameters
    ----------
    init_args : dict
        ``ray.init`` keyword arguments (:func:`fedpriv.run.runner.ray_init_args`).
    client_resources : dict
        ``num_cpus`` and ``num_gpus`` of one client actor.
    timeout : float
        Seconds (> 0) that reaching a given ``address`` may take (``ray_connect_timeout_s``).

    Raises
    ------
    ConfigError
        ``ray_init_args.address`` unreachable, an unknown ``ray_init_args`` key, or
        ``client_resources`` beyond what the instance has. Ray is shut down first.
    """
    import ray

    if ray.is_initialized():
        return
    _start_reaper()
    address = init_args.get("address") or os.environ.get("RAY_ADDRESS") or "local"
    if address not in ("local", "auto"):
        probe_address(str(address), timeout)
    where = "a local instance" if address == "local" else f"the cluster at {address}"
    print(f"fedpriv: starting Ray ({where}) ...", file=sys.stderr, flush=True)
    _init_with_deadline(ray, init_args, timeout if address != "local" else None)
    try:
        check_fits(ray.cluster_resources(), client_resources)
    except ConfigError:
        ray.shutdown()
        raise


def unreachable_reason(address: str, timeout: float) -> str:
    """Why ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) gave no TCP answer within
    ``timeout`` seconds (``"ConnectionRefusedError: ..."``); ``""`` if something answered.

    Raises
    ------
    ValueError
        If ``address`` is not of that form.
    """
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not of the form HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def probe_address(address: str, timeout: float) -> None:
    """Refuse ``address`` if no TCP listener answers there within ``timeout`` seconds.

    Raises
    ------
    ConfigError
        ``ray_init_args.address=127.0.0.1:1 must name a running Ray cluster: ...``.
    """
    try:
        reason = unreachable_reason(address, timeout)
    except ValueError:
        raise ConfigError(
            "ray_init_args.address", address, "must be local, auto, HOST:PORT or ray://HOST:PORT"
        ) from None
    if reason:
        raise ConfigError(
            "ray_init_args.address",
            address,
            f"must name a running Ray cluster: no answer ({reason}; waited at most "
            f"{timeout:g} s); start one (ray start --head) or leave it null for a local "
            "instance",
        )


def _init_with_deadline(ray: Any, init_args: dict[str, Any], timeout: float | None) -> None:
    """``ray.init(**init_args)``; with ``timeout``, in a thread given that many seconds."""
    errors: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(**init_args)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    if timeout is None:
        init()
    else:
        worker = threading.Thread(target=init, name="fedpriv-ray-init", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise ConfigError(
                "ray_init_args.address",
                init_args.get("address"),
                f"did not accept a connection within ray_connect_timeout_s={timeout:g} s",
            )
    if errors:
        raise _init_error(errors[0], init_args) from None


def _init_error(exc: BaseException, init_args: dict[str, Any]) -> BaseException:
    """A ConfigError naming the ``ray_init_args`` key Ray refused, else ``exc`` itself."""
    text = str(exc)
    if "Unknown keyword argument" in text:
        unknown = text.split(":", 1)[-1].strip().split(",")[0].strip()
        return ConfigError(
            f"ray_init_args.{unknown}",
            init_args.get(unknown),
            "is not an argument of ray.init (see its documentation)",
        )
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return ConfigError(
            "ray_init_args.address", init_args.get("address"), f"is unreachable: {text}"
        )
    return exc


def check_fits(resources: dict[str, float], client_resources: dict[str, Any]) -> None:
    """Refuse ``client_resources`` that exceed the instance's total ``resources``.

    Raises
    ------
    ConfigError
        ``client_resources.num_gpus=1 must be at most the Ray instance's 0 GPUs ...``.
    """
    for key, ray_key, unit in (("num_cpus", "CPU", "CPUs"), ("num_gpus", "GPU", "GPUs")):
        wanted = float(client_resources.get(key) or 0)
        have = float(resources.get(ray_key, 0.0))
        if wanted > have:
            hint = (
                "set client_resources.num_gpus=0 (and device=cpu)"
                if ray_key == "GPU" and have == 0
                else f"set client_resources.{key} <= {have:g}"
            )
            raise ConfigError(
                f"client_resources.{key}",
                client_resources.get(key),
                f"must be at most the Ray instance's {have:g} {unit} (no client actor could "
                f"start): {hint}",
            )


def release_stuck_clients(simulation_done: threading.Event, grace: float = 5.0) -> None:
    """Once the server has finished: if the simulation has not ended within ``grace``
    seconds (a client actor still computing a reply nobody waits for: a timed-out client),
    kill this process's client actors so that Flower's workers return and the run ends."""

    def release() -> None:
        if simulation_done.wait(grace):
            return
        import logging

        import psutil

        logging.getLogger("flwr").setLevel(logging.CRITICAL)  # the killed actors' errors
        print(
            "fedpriv: the server is done; stopping client actors still computing a reply "
            "nobody waits for (a timed-out client)",
            file=sys.stderr,
        )
        for child in psutil.Process().children(recursive=True):
            try:
                if "ClientAppActor" in " ".join(child.cmdline()):
                    child.kill()
            except psutil.Error:
                continue

    threading.Thread(target=release, name="fedpriv-release-clients", daemon=True).start()


_REAPER: list[subprocess.Popen[bytes]] = []


def _start_reaper() -> None:
    """Start the reaper of this process's tree once (see the module docstring)."""
    if _REAPER or not sys.platform.startswith("linux"):
        return
    _REAPER.append(
        subprocess.Popen(
            [sys.executable, "-m", "fedpriv.run.ray_session", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )


def reap_when_gone(pid: int, interval: float = 0.5) -> None:
    """Wait for process ``pid`` to end, then kill every process that was in its tree.

    The tree is sampled every ``interval`` seconds while ``pid`` lives; a process is killed
    only if its creation time is still the sampled one (a reused pid is left alone).
    """
    import psutil

    seen: dict[int, float] = {}
    me = os.getpid()
    try:
        parent = psutil.Process(pid)
        while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
            seen.update({c.pid: c.create_time() for c in parent.children(recursive=True)})
            seen.pop(me, None)
            time.sleep(interval)
    except psutil.Error:
        pass
    for child_pid, created in seen.items():
        try:
            child = psutil.Process(child_pid)
            if child.create_time() == created:
                child.kill()
        except psutil.Error:
            continue


if __name__ == "__main__":
    reap_when_gone(int(sys.argv[1]))
