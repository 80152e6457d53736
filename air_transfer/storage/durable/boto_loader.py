"""One botocore data loader for every boto3 session the durable tier makes: each
session otherwise loads and keeps its own copy of the S3 service model (~35,000
Python objects, ~60 ms), once per distinct ``S3FileSystem`` whose client is cached."""

from __future__ import annotations

import threading
from typing import Any

_loader: Any = None
_lock = threading.Lock()


def botocore_session() -> Any:
    """A new botocore session (its own credentials and settings) that loads service
    models through the process's one shared, caching loader."""
    global _loader
    import botocore.session

    session = botocore.session.get_session()
    with _lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session
