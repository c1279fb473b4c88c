"""Run plans for unit tests: the default config's plan with some top-level keys changed,
built without running a whole :func:`~fedpriv.run.prepare.prepare` (no data is loaded)."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from fedpriv.run.config import compose_config, to_container
from fedpriv.run.plan import RunPlan
from fedpriv.run.prepare import build_spec, plan_of


@lru_cache(maxsize=1)
def _default_node() -> str:
    return json.dumps(to_container(compose_config([])))


def node_with(**top: Any) -> dict[str, Any]:
    """The default config as a dict, ``top`` merged in (dict values merged one level)."""
    node: dict[str, Any] = json.loads(_default_node())
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(node.get(key), dict):
            node[key] = {**node[key], **copy.deepcopy(value)}
        else:
            node[key] = value
    return node


def plan_with(**top: Any) -> RunPlan:
    """The :class:`RunPlan` of :func:`node_with` (validated as a plan, nothing else)."""
    node = node_with(**top)
    return plan_of(node, build_spec(node["privacy"]))
