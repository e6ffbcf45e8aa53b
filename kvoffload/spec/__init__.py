"""The contract and the formal model: pure, immutable, no torch."""

import importlib
from typing import TYPE_CHECKING

from kvoffload.spec.contract import (
    InspectableManager,
    InspectablePolicy,
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    InvalidKeyError,
    OffloadingError,
    TierClosedError,
    TransferError,
)
from kvoffload.spec.keys import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_offload_key,
)
from kvoffload.spec.lifecycle import Call, Phase, PhaseKind

__all__ = [
    "POLICY_NAMES",
    "ARCModel",
    "AnyPolicyModel",
    "Call",
    "ConfigurationError",
    "IllegalTransitionError",
    "InspectableManager",
    "InspectablePolicy",
    "InvalidKeyError",
    "Invariant",
    "LRUModel",
    "LoadStoreSpec",
    "LookupResult",
    "ManagerModel",
    "OffloadKey",
    "OffloadingError",
    "OffloadingEvent",
    "OffloadingManager",
    "Phase",
    "PhaseKind",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "ReuseFilterModel",
    "SpecViolation",
    "Step",
    "StoreResult",
    "TierClosedError",
    "TransferError",
    "Violation",
    "check_state",
    "check_step",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "render_mermaid",
    "validate_offload_key",
]

# The formal model: lifecycle diagram, manager/policy/filter models,
# invariants. Imported on first use, so that importing the production managers
# (which need only the contract above) does not execute the models.
_LAZY = {
    "ARCModel": "kvoffload.spec.policies",
    "AnyPolicyModel": "kvoffload.spec.policies",
    "Invariant": "kvoffload.spec.invariants",
    "POLICY_NAMES": "kvoffload.spec.policies",
    "LRUModel": "kvoffload.spec.policies",
    "ManagerModel": "kvoffload.spec.model",
    "ReuseFilterModel": "kvoffload.spec.reuse",
    "SpecViolation": "kvoffload.spec.model",
    "Step": "kvoffload.spec.invariants",
    "StoreResult": "kvoffload.spec.model",
    "Violation": "kvoffload.spec.invariants",
    "check_state": "kvoffload.spec.invariants",
    "check_step": "kvoffload.spec.invariants",
    "render_mermaid": "kvoffload.spec.lifecycle",
}

if TYPE_CHECKING:
    from kvoffload.spec.invariants import Invariant, Step, Violation, check_state, check_step
    from kvoffload.spec.lifecycle import render_mermaid
    from kvoffload.spec.model import ManagerModel, SpecViolation, StoreResult
    from kvoffload.spec.policies import POLICY_NAMES, AnyPolicyModel, ARCModel, LRUModel
    from kvoffload.spec.reuse import ReuseFilterModel


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

