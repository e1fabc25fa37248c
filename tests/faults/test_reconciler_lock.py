"""The reconciler holds its Redis lock for as long as it runs: renewed at each stage, and a
run whose lock expired and was taken by another stops instead of publishing twice."""

from __future__ import annotations

import pytest

from worker.queue.lock import RenewableLock

pytestmark = pytest.mark.services


def test_lock_is_renewed_and_a_lost_lock_stops_the_run(redis_client, keys) -> None:
    first = RenewableLock(redis_client, keys.reconcile_lock, "one", 5)
    assert first.take()
    assert not RenewableLock(redis_client, keys.reconcile_lock, "two", 5).take()
    redis_client.expire(keys.reconcile_lock, 1)
    first.renew()
    assert redis_client.ttl(keys.reconcile_lock) > 1  # extended back to its full TTL
    redis_client.set(keys.reconcile_lock, "two", ex=5)  # expired, then taken by another run
    with pytest.raises(RuntimeError, match=r"lock .* was lost"):
        first.renew()
    first.release()
    assert redis_client.get(keys.reconcile_lock) == "two"  # not ours: left alone
