"""The Store protocol on etcd v3 (:mod:`~agentd.store.etcd.store`), through its JSON gateway
(:mod:`~agentd.store.etcd.gateway`, error codes in :mod:`~agentd.store.etcd.codes`), reached
from ``--rdzv-endpoint`` and ``--rdzv-conf`` (:mod:`~agentd.store.etcd.connect`)."""
