"""Redis Streams transport: stream keys, the message schema, producer, consumer-group
reads, claims of stale entries, dead letters, trimming, cancellation and the reconciler.

Importing this package connects to nothing; callers pass a ``redis.Redis`` in.
"""
