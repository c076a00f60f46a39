"""The benchmarks' S3 server: moto's (``moto[server]``, the test extra), in this process on loopback.

``start_moto()`` starts it and points this process (and the processes it starts) at it through
``AWS_ENDPOINT_URL`` and dummy credentials; ``.stop()`` the server it returns when done.
"""

from __future__ import annotations

import logging
import os
from typing import Any


def start_moto() -> Any:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    return server
