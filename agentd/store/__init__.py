"""The key-value store agents rendezvous through: a protocol, a server, and clients."""

from agentd.store.api import (
    KeyEvent,
    Store,
    StoreAuthError,
    StoreError,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
    WatchResult,
)

__all__ = [
    "KeyEvent",
    "Store",
    "StoreAuthError",
    "StoreError",
    "StoreRefused",
    "StoreTimeout",
    "StoreUnavailable",
    "WatchResult",
]
