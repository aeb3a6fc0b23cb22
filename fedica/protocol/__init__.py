"""fedica's protocol kit: the messages both sides speak, the server-side state, one driver, one task registry.

- :mod:`fedica.protocol.messages`: the tasks (Flower message types), :class:`Request` and
  :class:`Reply`, and the reply checks that raise :class:`InvalidReply` with a named reason;
- :mod:`fedica.protocol.state`: :class:`ProtocolState`, the base of every protocol's server-side
  state (its books of rejected replies, ``require``, timings);
- :mod:`fedica.protocol.driver`: :func:`drive` and :class:`InMemoryFederation`, the one in-memory
  driver of the estimators and the comparators;
- :mod:`fedica.protocol.journal`: :class:`Journal`, every completed stage's replies on disk, and
  :func:`journaled`, which replays them into a fresh protocol so that an interrupted run resumes;
- :mod:`fedica.protocol.tasks`: :class:`ClientTasks`, the client side's task registry with its
  chain of reply transforms.

Everything here is plain numpy: the Flower side (``fedica.server``, ``fedica.clients``) only carries
the same requests and replies over a Grid.
"""

from fedica.protocol.driver import InMemoryFederation, ProtocolDriver, ProtocolRun, drive
from fedica.protocol.journal import Journal, JournalError, journaled
from fedica.protocol.messages import (
    AFCL_INIT,
    AFCL_ROUND,
    CATEGORY,
    CLUSTER_SHAPE_KEY,
    COLUMNS_KEY,
    ERROR_KEY,
    EVALUATE,
    FFCM_INIT,
    FFCM_ROUND,
    GEM_CLUSTER_MOMENTS,
    GEM_FAMILY_EM,
    GEM_EVALUATE,
    GEM_FINAL,
    GEM_INIT,
    GEM_LIKELIHOOD,
    GEM_MOMENTS,
    GEM_ROUND,
    GEM_SILHOUETTE,
    K_AT_BOUND_KEY,
    RAY_NODE_KEY,
    REPORT_CLUSTER_SHAPE_KEY,
    REPORT_SCALE_SPREAD_KEY,
    REPLY_SIZE_FLOOR,
    RFICA_FIT,
    SCALE_SPREAD_KEY,
    TRAIN,
    InvalidReply,
    MisalignedSites,
    NotEnoughClients,
    OverBudget,
    Reply,
    Request,
    RunStopped,
    check_reply_size,
    client_text,
    column_majority,
    majority_width,
    message_type,
    optional_float,
    payload_bytes,
    reply_size_limits,
    reported_columns,
    reported_ray_node,
    reported_seconds,
    require_array,
    require_int,
    validate_gem_components,
    validate_ica_reply,
    validate_weights,
)
from fedica.protocol.state import ProtocolState, Rejection, record_rejection
from fedica.protocol.tasks import ArraySite, ClientTasks, Handler, Site, Transform

__all__ = [
    "AFCL_INIT", "AFCL_ROUND", "CATEGORY", "CLUSTER_SHAPE_KEY", "COLUMNS_KEY", "ERROR_KEY", "EVALUATE", "FFCM_INIT", "FFCM_ROUND", "GEM_CLUSTER_MOMENTS", "GEM_EVALUATE", "GEM_FAMILY_EM",
    "GEM_FINAL", "GEM_INIT", "GEM_LIKELIHOOD", "GEM_MOMENTS", "GEM_ROUND", "GEM_SILHOUETTE", "K_AT_BOUND_KEY", "RAY_NODE_KEY", "REPORT_CLUSTER_SHAPE_KEY",
    "REPORT_SCALE_SPREAD_KEY",
    "RFICA_FIT", "SCALE_SPREAD_KEY", "TRAIN",
    "ArraySite", "ClientTasks", "Handler", "InMemoryFederation", "InvalidReply", "Journal", "JournalError",
    "MisalignedSites", "NotEnoughClients", "OverBudget",
    "ProtocolDriver", "ProtocolRun", "ProtocolState", "Rejection", "Reply", "Request", "RunStopped", "Site",
    "Transform", "column_majority", "drive", "journaled", "majority_width", "message_type", "optional_float", "record_rejection",
    "reported_columns", "reported_ray_node", "reported_seconds", "require_array", "require_int", "validate_gem_components",
    "validate_ica_reply", "validate_weights",
    # the size of a reply
    "REPLY_SIZE_FLOOR", "check_reply_size", "client_text", "payload_bytes", "reply_size_limits",
]
