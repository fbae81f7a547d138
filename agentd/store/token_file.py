"""The store's secret when none is given: made by the server, found by same-user clients.

A store is never served without a token. When the user gives none (``--store-token``,
``AGENTD_STORE_TOKEN``) and the store listens on loopback, the server makes a random one
and publishes it in ``<run dir>/store-<port>.token`` (mode 0600). The run dir is private to
the user: ``$XDG_RUNTIME_DIR/agentd`` or ``/tmp/agentd-<uid>``, mode 0700, owned by the user,
not a symlink; anything else there is refused, never used. Clients of a loopback store
without a token read the file, so one user's agents on one host meet with no
configuration, while another local user can neither read the token nor use the store.
Off loopback, a token must be given (the file cannot reach another host).

The token is the job's, not one server's: each member standing by for the seed keeps a
copy (``store-<port>.<pid>-<n>.token``, :func:`keep_copy`) while it does, and a store
started on that port without a token takes the job's (:func:`read`) before making one. A
seed restarted at the endpoint after the job failed over is then told the job's term and
list by its candidates, and follows them, instead of serving a second job alone, its
new token refused by every candidate of the first.

A killed agent cannot withdraw what it published: each file is told to
:func:`agentd.support.secrets.on_published`'s listeners, the agent's guardian among them
(:mod:`agentd.hygiene.guardian_process`), which removes each one that still holds its token
once the agent is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import stat
from pathlib import Path

from agentd.exceptions import StartError
from agentd.store.api import StoreAuthError
from agentd.support.secrets import published, withdrawn


def run_dir() -> Path:
    """The user's private directory for agentd's secrets (created 0700 if missing)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "agentd" if runtime else Path(f"/tmp/agentd-{os.getuid()}")
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StartError(f"store token: cannot create {base}: {exc.strerror}") from None
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise StartError(
            f"store token: {base} is not a directory owned by uid {os.getuid()}; "
            "refusing to keep a secret there (remove it, or set "
            "AGENTD_STORE_TOKEN)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(base, 0o700)  # ours, but readable by others: close it first
    return base


def token_path(port: int, kind: str = "store") -> Path:
    """Where the token of the loopback store (``kind`` "health": the health endpoint's
    ``POST /drain``) on ``port`` is published."""
    return run_dir() / f"{kind}-{port}.token"


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return secrets.token_urlsafe(32)


def publish(port: int, token: str, kind: str = "store") -> Path:
    """Publish ``token`` as the one of the store on ``port`` (atomically, mode 0600)."""
    return _write(token_path(port, kind), token)


def keep_copy(port: int, token: str) -> Path:
    """Keep a copy of ``token``, the job's whose seed listens on ``port``, for a store
    started there later (:func:`read`), until :func:`drop_copy`."""
    return _write(run_dir() / f"store-{port}.{os.getpid()}-{next(_copies)}.token", token)


def drop_copy(path: Path, token: str) -> None:
    """Remove a copy :func:`keep_copy` made, if it still holds ``token``."""
    with contextlib.suppress(OSError):
        _remove(path, token)


_copies = itertools.count()


def _write(path: Path, token: str) -> Path:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)
    published(path, token)
    return path


def read(port: int, kind: str = "store") -> str | None:
    """The published token of the loopback store on ``port``, else the newest copy a
    member of its job keeps (see the module docstring), if there is one."""
    try:
        return token_path(port, kind).read_text().strip() or None
    except (OSError, StartError):
        pass
    if kind != "store":
        return None
    try:
        copies = list(run_dir().glob(f"store-{port}.*.token"))
    except (OSError, StartError):
        return None
    for path in sorted(copies, key=_newest_first):
        with contextlib.suppress(OSError):
            if token := path.read_text().strip():
                return token
    return None


def _newest_first(path: Path) -> float:
    """Sorts the most recently written first (an unreadable one last)."""
    try:
        return -path.stat().st_mtime
    except OSError:
        return float("inf")


def withdraw(port: int, token: str, kind: str = "store") -> None:
    """Remove the published token, if it is still ours (a newer store may have replaced it)."""
    with contextlib.suppress(OSError, StartError):
        _remove(token_path(port, kind), token)


def _remove(path: Path, token: str) -> None:
    """Tell the listeners ``path`` is withdrawn; remove it if it still holds ``token``."""
    withdrawn(path, token)
    if path.read_text().strip() == token:
        path.unlink()


def for_agent(url: str, given: str | None) -> str | None:
    """The token for an agent's guarded requests (``POST /drain``, ``GET /logs``) at
    ``url``: ``given`` (the operator's), else the one a local agent published for this
    user (a loopback URL only: no other host's agent publishes here)."""
    from urllib.parse import urlsplit

    if given:
        return given
    parts = urlsplit(url)
    if parts.hostname in ("localhost", "::1") or (parts.hostname or "").startswith("127."):
        return read(parts.port or 80, "health")
    return None


def refused(url: str, port: int, given: bool) -> StoreAuthError:
    """Why the loopback store at ``url`` refused a client using the token it publishes
    for ``port`` (``given``: the request carried one)."""
    path = token_path(port)
    if given:
        why = f"it refused the token in {path}"
    else:
        why = f"no token was given and {path} does not exist (yet)"
    return StoreAuthError(
        f"store at {url}: {why}; a store served by another user needs its token in "
        "AGENTD_STORE_TOKEN"
    )
