"""Redis client construction from ``REDIS_URL`` or a flag: one server, or a Redis Cluster.

A URL whose scheme is ``redis+cluster://`` (``rediss+cluster://`` with TLS) names a
cluster: ``redis+cluster://[user:password@]host:port[,host:port...]``, any of its nodes
(more than one so that the client starts while one of them is down); the client learns the
others and follows the slots as they move. A cluster has one database, so the URL names
none. Every other scheme is a single server, as redis-py reads it (``redis://``,
``rediss://``, ``unix://``).
"""

from __future__ import annotations

import os
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def redis_url(flag: str | None = None) -> str:
    """The URL to use: the flag if given, else ``REDIS_URL``, else redis://127.0.0.1:6379/0."""
    return flag or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def is_cluster_url(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def is_cluster(client: Any) -> bool:
    """True when ``client`` talks to a Redis Cluster."""
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def _cluster_parts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The startup nodes and the connection options of a cluster URL (ValueError when it
    names no node, or a database other than 0)."""
    parts = urlsplit(url)
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = item.strip(), "6379"
        if not host or not port.isdigit():
            raise ValueError(f"cluster URL {url!r}: {item!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"cluster URL {url!r}: a cluster has database 0 only")
    options: dict[str, Any] = {}
    if auth:
        user, sep, password = auth.partition(":")
        if sep:
            options["username"], options["password"] = unquote(user) or None, unquote(password)
        else:
            options["password"] = unquote(user)
    if parts.scheme.lower().startswith("rediss"):
        options["ssl"] = True
    return nodes, options


def _cluster_kwargs(url: str, node: Any, connect_timeout: float, timeout: float) -> dict[str, Any]:
    """The arguments of a (sync or asyncio) ``RedisCluster`` for a cluster URL; ``node``
    is its ``ClusterNode`` class."""
    nodes, options = _cluster_parts(url)
    return {
        "startup_nodes": [node(h, p) for h, p in nodes],
        "decode_responses": True,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": timeout,
        **options,
    }


def make_redis(
    *, url: str, connect_timeout: float = 5, timeout: float = 30
) -> redis.Redis:
    """A client returning ``str`` values, with timeouts so a dead server is noticed; a
    ``RedisCluster`` (typed as the ``redis.Redis`` whose commands it answers) for a cluster
    URL."""
    if is_cluster_url(url):
        cluster = RedisCluster(**_cluster_kwargs(url, ClusterNode, connect_timeout, timeout))
        return cast(redis.Redis, cluster)
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=connect_timeout,
        socket_timeout=timeout,
        health_check_interval=30,
    )


def make_async_redis(*, url: str, connect_timeout: float = 5, timeout: float = 30) -> aioredis.Redis:
    """The asyncio client of :func:`make_redis` (an API process's blocking reads)."""
    if is_cluster_url(url):
        kwargs = _cluster_kwargs(url, AsyncClusterNode, connect_timeout, timeout)
        return cast(aioredis.Redis, AsyncRedisCluster(**kwargs))
    return aioredis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=connect_timeout, socket_timeout=timeout
    )
