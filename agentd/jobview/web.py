"""The job page's files (``page/``), served read-only by the health endpoint at ``/``.

Three static files ship inside the package: no CDN, no build step, nothing fetched at
run time. The page itself reads ``/job`` and ``/status`` of the agent that serves it; it
holds no token and can change nothing.
"""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).with_name("page")
FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
"""Every file the page is made of, by name, with its content type."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
"""The page runs only its own script, and reads only its own agent."""


def page_file(name: str) -> tuple[bytes, str] | None:
    """The bytes and content type of the page's file ``name`` (None: no such file)."""
    content_type = FILES.get(name)
    if content_type is None:
        return None
    return (PAGE / name).read_bytes(), content_type
