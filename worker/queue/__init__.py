"""Redis Streams transport: stream keys, the message schema, producer, consumer-group
reads, claims of stale entries, dead letters, trimming, cancellation and the reconciler.

Every key name comes from ``keys.py`` (hash-tagged per model and per deployment, so the
same code runs on one Redis server and on a Redis Cluster). Importing this package
connects to nothing; callers pass a client in (``connection.make_redis``: a
``redis.Redis``, or a ``RedisCluster`` for a ``redis+cluster://`` URL).
"""
