"""The limiters behind ``proxy.limits.limiter.Limiter``: the in-process one (``memory``,
and ``divided`` for a replica's share), and the one on a Redis/Valkey store shared by
replicas, behind its timeout, breaker and fail modes. The policy they enforce is
``proxy.limits``'s; serving only calls the protocol."""
