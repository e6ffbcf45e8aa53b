"""The contract and the formal model: pure, immutable, no torch."""

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
    "Call",
    "ConfigurationError",
    "IllegalTransitionError",
    "InvalidKeyError",
    "LoadStoreSpec",
    "LookupResult",
    "OffloadKey",
    "OffloadingError",
    "OffloadingEvent",
    "OffloadingManager",
    "Phase",
    "PhaseKind",
    "PrepareStoreOutput",
    "InspectableManager",
    "InspectablePolicy",
    "ReqContext",
    "RequestOffloadingContext",
    "TransferError",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "validate_offload_key",
]

# The formal model: lifecycle diagram, manager/policy/filter models,
# invariants.
from kvoffload.spec.invariants import (
    Invariant,
    Step,
    Violation,
    check_state,
    check_step,
)
from kvoffload.spec.lifecycle import render_mermaid
from kvoffload.spec.model import ManagerModel, SpecViolation, StoreResult
from kvoffload.spec.policies import POLICY_NAMES, AnyPolicyModel, ARCModel, LRUModel
from kvoffload.spec.reuse import ReuseFilterModel

__all__ += [
    "ARCModel",
    "AnyPolicyModel",
    "Invariant",
    "POLICY_NAMES",
    "LRUModel",
    "ManagerModel",
    "ReuseFilterModel",
    "SpecViolation",
    "Step",
    "StoreResult",
    "Violation",
    "check_state",
    "check_step",
    "render_mermaid",
]
