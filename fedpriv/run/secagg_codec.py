"""SecAgg+ glue shared by the client side and the server side (core): the wire codec and the
client mod.

The codec (content packing, limb splitting and joining, the FitIns/FitRes keys) is used by
:class:`strategies.secaggplus.SecAggPlusAggregator` on the server and by the mod on every
client, so both import it from here and never each other.

Client side: one mod lets the same ``@app.train()`` handler serve both the ideal aggregator and
the SecAgg+ aggregator. Register it on the ClientApp: ``ClientApp(mods=SECAGG_MODS)``. A train
message without SecAgg+ configs goes straight to the handler. A SecAgg+ message runs Flower's
``secaggplus_mod``; in its masked-vector stage the adapter unpacks the original Message-API
content from the legacy ``FitIns``, calls the handler, and turns its reply (an ``update``
ArrayRecord of integers in ``[0, 2**bits)`` and a ``metrics`` MetricRecord) into the legacy
``FitRes`` that ``secaggplus_mod`` masks: the integers split into limbs, weight 1, and the
update's layout (names and shapes, public) in the metrics. The arithmetic is explained in
:mod:`strategies.secaggplus`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.compat.common import recorddict_compat as compat
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedpriv.common.errors import check
from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from fedpriv.run.aggregation import RoundFailed

CONTENT_KEY = (
    "fedpriv.run.secagg_codec.content"  # FitIns config: the original train RecordDict (bytes)
)
BITS_KEY = "fedpriv.run.secagg_codec.bits"  # FitIns config: residue width
LIMB_KEY = "fedpriv.run.secagg_codec.limb_bits"  # FitIns config: limb width L
LAYOUT_KEY = (
    "fedpriv.run.secagg_codec.layout"  # FitRes metrics: JSON [[key, shape], ...] of the update
)
MODULUS_BITS = 32  # Flower's default modulus range 2**32 (documented upper limit)
MAX_LIMB_BITS = 31  # Flower casts quantized values to int32


# ---- codec shared by the client mod and the server ------------------------------------
def pack_content(content: RecordDict) -> bytes:
    """Serialize a Message-API ``RecordDict`` (ProtoBuf bytes) to ride in a legacy FitIns."""
    return cast(bytes, recorddict_to_proto(content).SerializeToString())


def unpack_content(data: bytes) -> RecordDict:
    """Inverse of :func:`pack_content`."""
    return recorddict_from_proto(ProtoRecordDict.FromString(data))


def limb_bits_for(bits: int, num_clients: int) -> int:
    """L: limb width so that ``num_clients`` limb sums and weights stay below ``2**32``.

    ``K = ceil(bits / Lmax)`` limbs of ``L = ceil(bits / K)`` bits, with
    ``Lmax = min(31, 32 − ceil(log2(num_clients + 1)))``.
    """
    lmax = min(MAX_LIMB_BITS, MODULUS_BITS - math.ceil(math.log2(num_clients + 1)))
    check(lmax >= 1, "num_clients", num_clients, "is too large for a 2**32 SecAgg+ modulus")
    return math.ceil(bits / math.ceil(bits / lmax))


def split_limbs(flat: np.ndarray, bits: int, limb_bits: int) -> list[np.ndarray]:
    """Residues ``(D,)`` in ``[0, 2**bits)`` → K float64 arrays ``limb − 2**(L−1)`` for Flower."""
    num = math.ceil(bits / limb_bits)
    mask, centre = (1 << limb_bits) - 1, float(1 << (limb_bits - 1))
    return [((flat >> (k * limb_bits)) & mask).astype(np.float64) - centre for k in range(num)]


def join_limb_means(means: Sequence[np.ndarray], num_clients: int, limb_bits: int) -> np.ndarray:
    """Flower's per-limb means over ``num_clients`` → the exact int64 sum of the residues.

    Raises
    ------
    RoundFailed
        If a recovered limb sum is outside ``[0, n (2**L − 1)]`` (a corrupted aggregate).
    """
    n, centre = num_clients, 1 << (limb_bits - 1)
    total = np.zeros(np.asarray(means[0]).shape, dtype=np.int64)
    for k, mean in enumerate(means):
        limb_sum = np.rint(np.asarray(mean, dtype=np.float64) * n).astype(np.int64) + n * centre
        if limb_sum.size and (limb_sum.min() < 0 or limb_sum.max() > n * ((1 << limb_bits) - 1)):
            raise RoundFailed(f"SecAgg+ limb {k} sum out of range: the aggregate is corrupted")
        total += limb_sum << (k * limb_bits)
    return total


# ---- client side ------------------------------------------------------------------------
FITINS_CONFIG = "fitins.config"


def flatten_update(update: ArrayRecord, bits: int) -> tuple[np.ndarray, list[list[Any]]]:
    """The update's arrays concatenated to int64 ``(D,)`` and their layout ``[[key, shape]]``.

    Raises
    ------
    TypeError
        If an array is not of an integer dtype.
    ValueError
        If a value is outside ``[0, 2**bits)``.
    """
    flats, layout = [], []
    for key, arr in zip(update.keys(), update.to_numpy_ndarrays(keep_input=True), strict=True):
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"SecAgg+ sums integers only: update[{key!r}] has dtype {arr.dtype}")
        flats.append(arr.astype(np.int64).reshape(-1))
        layout.append([key, list(arr.shape)])
    flat = np.concatenate(flats) if flats else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= (1 << bits)):
        raise ValueError(
            f"SecAgg+ update values must be in [0, 2**{bits}); got [{flat.min()}, {flat.max()}]"
        )
    return flat, layout


def _legacy_reply(reply: Message, bits: int, limb_bits: int) -> RecordDict:
    """The handler's Message-API reply as a legacy ``FitRes`` RecordDict for secaggplus_mod."""
    flat, layout = flatten_update(reply.content.array_records[UPDATE_KEY], bits)
    metrics: dict[str, Any] = {}
    if METRICS_KEY in reply.content.metric_records:
        metrics.update(reply.content.metric_records[METRICS_KEY])
    metrics[LAYOUT_KEY] = json.dumps(layout)
    fitres = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters(split_limbs(flat, bits, limb_bits)), 1, metrics
    )
    return compat.fitres_to_recorddict(fitres, keep_input=True)


def _adapter(call_next: ClientAppCallable) -> ClientAppCallable:
    """Inner callable of secaggplus_mod: legacy FitIns → handler → legacy FitRes."""

    def handle(msg: Message, ctxt: Context) -> Message:
        cfg = msg.content.config_records[FITINS_CONFIG]
        inner = Message(content=unpack_content(bytes(cfg[CONTENT_KEY])), metadata=msg.metadata)  # type: ignore[arg-type, call-overload]
        reply = call_next(inner, ctxt)
        if reply.has_error():
            raise RuntimeError(f"train handler failed: {reply.error.reason}")
        return Message(_legacy_reply(reply, int(cfg[BITS_KEY]), int(cfg[LIMB_KEY])), reply_to=msg)  # type: ignore[arg-type]

    return handle


def fedpriv_secaggplus_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Run Flower's ``secaggplus_mod`` for SecAgg+ messages; pass any other message through."""
    if not msg.has_content() or RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, ctxt)
    return secaggplus_mod(msg, ctxt, _adapter(call_next))


SECAGG_MODS: list[Mod] = [fedpriv_secaggplus_mod]
"""Mods to register on a ClientApp so it works with both the ideal and the SecAgg+ aggregator."""
