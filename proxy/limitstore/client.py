"""The limits store's client (``--limits-store``): its URL (valkey:// is redis://), one
client with a bounded pool and no retries, its timeout on every socket operation; and
what counts as a store failure (``STORE_ERRORS``)."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

# A store call that raises one of these failed: the fail mode decides, the breaker counts.
STORE_ERRORS = (RedisError, OSError, TimeoutError)
SLOTS = 8  # requests' store calls at once (more queue longer on the loop inside the timeout)


def connect(
    url: str, *, timeout: float, password: str | None = None, connections: int = SLOTS + 2
) -> Redis:
    """A client of the store (valkey:// is redis://): a bounded pool that opens its
    connections on first use, every socket operation bounded by ``timeout``, and no
    retries, set here rather than left to the library (whose default differs by
    constructor and release: redis-py 8's ``Redis()`` retries ten times with backoff):
    a reservation is not idempotent, so a script sent again after its answer was lost
    would reserve twice; a broken call is a store failure for the fail mode to decide,
    and no reconnection stretches a wait. (A pooled connection the server closed while
    idle is found at checkout and opened again before anything is sent: redis-py 8 does
    that, 5 did not.)"""
    for alias, scheme in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
        if url.startswith(alias):
            url = scheme + url.removeprefix(alias)
    pool = BlockingConnectionPool.from_url(
        url,
        password=password,
        max_connections=connections,
        timeout=None,  # the requests wait for a slot instead (GuardedLimiter.slots)
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    return Redis.from_pool(pool)  # owns the pool: aclose disconnects it
