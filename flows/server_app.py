"""The temporary server's application: Prefect's API as its own temporary server runs it, for ``uvicorn --factory``.

``create_app(ephemeral=True)`` is Prefect's public switch for a server that
serves one client briefly: the API only, no UI and no background services
(Prefect's own temporary server uses it).
"""

from __future__ import annotations

from typing import Any


def app() -> Any:
    from prefect.server.api.server import create_app

    return create_app(ephemeral=True, final=True)
