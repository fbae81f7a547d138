"""The Store protocol over one call: a client whose every request is the same request of
the :class:`~agentd.store.http_client.HttpStore` it talks to now, sent by its ``_call``
(which chooses that store, and sends again where it must); what that client counts and
learns is read through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from agentd.store.api import WatchResult
    from agentd.store.http_client import HttpStore

T = TypeVar("T")


class ForwardingStore:
    """Each Store operation, as ``_call`` of the operation on the current server
    (``_client``)."""

    _client: HttpStore

    @property
    def token(self) -> str | None:
        return self._client.token

    @property
    def candidate_count(self) -> int:
        """The length of the serving candidate's growing list, as it last said."""
        return self._client.candidate_count

    @property
    def candidate_list(self) -> str:
        """The fingerprint of that list, as it last said."""
        return self._client.candidate_list

    @property
    def observer(self) -> Callable[[str, float], None] | None:
        return self._client.observer

    @observer.setter
    def observer(self, value: Callable[[str, float], None] | None) -> None:
        self._client.observer = value

    @property
    def absent(self) -> frozenset[int]:
        """The candidates the serving one last said it had not heard lately."""
        return self._client.absent

    @property
    def requests(self) -> int:
        """Store requests sent, retries included (probes are not counted)."""
        return self._client.requests

    @property
    def incarnation(self) -> int:  # :attr:`HttpStore.incarnation`: a failover is one more
        return self._client.incarnation

    @property
    def instance(self) -> str | None:  # :attr:`HttpStore.instance`
        return self._client.instance

    async def _call(self, request: Callable[[HttpStore], Awaitable[T]]) -> T:
        raise NotImplementedError

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self._call(lambda s: s.set(key, value, ttl))

    async def get(self, key: str) -> bytes | None:
        return await self._call(lambda s: s.get(key))

    async def add(self, key: str, delta: int) -> int:
        return await self._call(lambda s: s.add(key, delta))

    async def add_once(
        self, counter: str, marker: str, mark: bytes, absent: Sequence[str] = ()
    ) -> tuple[bool, int]:
        return await self._call(lambda s: s.add_once(counter, marker, mark, absent))

    async def compare_set(
        self,
        key: str,
        expected: bytes | None,
        desired: bytes,
        ttl: float | None = None,
        present: Sequence[str] = (),
        absent: Sequence[str] = (),
    ) -> tuple[bool, bytes | None]:
        return await self._call(
            lambda s: s.compare_set(key, expected, desired, ttl, present, absent)
        )

    async def refresh(self, key: str, ttl: float) -> bool:
        return await self._call(lambda s: s.refresh(key, ttl))

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._call(lambda s: s.multi_get(keys))

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        return await self._call(lambda s: s.multi_set(items, ttl))

    async def delete(self, key: str) -> bool:
        return await self._call(lambda s: s.delete(key))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._call(lambda s: s.delete_prefix(prefix))

    async def num_keys(self) -> int:
        return await self._call(lambda s: s.num_keys())

    async def revision(self) -> int:
        return await self._call(lambda s: s.revision())

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        await self._call(lambda s: s.wait(keys, timeout))

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        return await self._call(lambda s: s.watch(prefix, after_revision, timeout))
