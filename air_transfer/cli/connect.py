"""Joining the running Ray cluster, failing fast and saying which one was joined.

``ray.init(address=...)`` retries for minutes where nothing listens, prints each
retry, and reports a cluster that refused its authentication token as one it failed
to connect to. A command asks first, each step bounded: where ``--address`` leads
(``auto``: the cluster Ray would find), whether anything accepts a connection there
(``CONNECT_TIMEOUT_S``), and whether a Ray GCS answers it and accepts this process's
token (``HANDSHAKE_TIMEOUT_S``); only then does it join, and it says on stderr which
cluster it joined.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

import ray

from air_transfer.cluster import _ray_core
from air_transfer.core.threads import start_daemon

#: How long a TCP connection to the cluster's address may take to open.
CONNECT_TIMEOUT_S = 5.0
#: How long the cluster's GCS may take to answer a client (Ray's own retries: minutes).
HANDSHAKE_TIMEOUT_S = 10.0
#: What Ray's client mode addresses start with (``ray.init("ray://host:10001")``).
CLIENT_SCHEME = "ray://"
TOKEN_HELP = (
    "give the cluster's token in RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH "
    "names (default ~/.ray/auth_token), with RAY_AUTH_MODE=token"
)


def join(address: str, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str | None:
    """Join the Ray cluster at ``address`` (``auto``: the one Ray finds from this
    machine) as a driver; the line that says which cluster was joined (None if this
    process had joined one already). ConnectionError naming the address and the
    cause (none found, nothing listening, no GCS answering within ``timeout_s``, a
    refused token)."""
    reach_s = min(CONNECT_TIMEOUT_S, timeout_s)
    if ray.is_initialized():
        return None
    given = (os.environ.get("RAY_ADDRESS") or address) if address == "auto" else address
    named = f"--address {address}" + (f" (RAY_ADDRESS={given})" if given != address else "")
    if given.startswith(CLIENT_SCHEME):
        target = given
        reach(given[len(CLIENT_SCHEME) :], named, reach_s)
    else:
        target = resolve(address, named)
        reach(target, named, reach_s)
        handshake(target, named, address == "auto", timeout_s)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError) as e:
        raise ConnectionError(f"could not join the Ray cluster at {target} ({named}): {e}") from e
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    how = " (found by --address auto)" if address == "auto" else ""
    return f"joined the Ray cluster at {target}{how}: {nodes} live node(s), Ray {ray.__version__}"


def resolve(address: str, named: str) -> str:
    """The GCS address ``address`` leads to, as ``ray.init`` resolves it."""
    try:
        found = _ray_core.bootstrap_address(address)
    except ConnectionError as e:
        raise ConnectionError(
            f"no running Ray cluster found from this machine ({named}: neither RAY_ADDRESS "
            "nor a cluster started here with `ray start`); run the command on a node of "
            "the cluster, or pass its GCS address, --address HOST:PORT"
        ) from e
    except ValueError as e:
        raise ValueError(f"{named}: not a Ray address, HOST:PORT ({e})") from e
    if found is None:
        raise ValueError(f"{named}: a command joins a running cluster; give its address")
    return found


def reach(host_port: str, named: str, timeout_s: float) -> None:
    """ConnectionError unless a TCP connection to ``host_port`` opens in ``timeout_s``."""
    host, _, port = host_port.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{named}: {host_port!r} is not HOST:PORT") from None
    try:
        socket.create_connection((host, number), timeout=timeout_s).close()
    except TimeoutError as e:
        cause = f"no answer within {timeout_s:g} s (a firewall, or a host that is down?)"
        error: OSError = e
    except ConnectionRefusedError as e:
        cause, error = "connection refused: nothing listens on that port", e
    except OSError as e:  # an unknown host name, an unreachable network...
        cause, error = str(e), e
    else:
        return
    where = f"the Ray cluster at {host_port} ({named})"
    raise ConnectionError(f"cannot reach {where}: {cause}") from error


def handshake(target: str, named: str, auto: bool, timeout_s: float) -> None:
    """ConnectionError unless a Ray GCS at ``target`` answers within ``timeout_s`` and
    accepts this process's authentication token (the client runs on a thread of its
    own: Ray's waits are longer than ``timeout_s``)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            _ray_core.gcs_handshake(target, auto, timeout_s)
            outcome.append(None)
        except Exception as e:  # Ray's AuthenticationError, RpcError...
            outcome.append(e)

    start_daemon("air-transfer-gcs-handshake", run).join(timeout_s)
    if not outcome:
        raise ConnectionError(
            f"nothing at {target} ({named}) answered as a Ray GCS within {timeout_s:g} s: "
            "give the address `ray start --head` printed (port 6379 by default), not the "
            "dashboard's (8265) or Ray Client's (10001)"
        )
    error = outcome[0]
    if isinstance(error, ray.exceptions.AuthenticationError):
        raise ConnectionError(
            f"the Ray cluster at {target} ({named}) refused this command's authentication "
            f"token ({error.message}): {TOKEN_HELP}"
        ) from error
    if error is not None:
        raise ConnectionError(
            f"no Ray GCS answered at {target} ({named}): {type(error).__name__}: {error}"
        ) from error


def say(line: str | None) -> None:
    """The joined cluster's line on stderr (stdout stays the command's output)."""
    if line is not None:
        print(f"air-transfer: {line}", file=sys.stderr)
