"""The key layer: hash tags that keep every key used together in one Redis Cluster slot,
model ids that cannot break a tag, and the URLs that name a cluster."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from worker.queue.connection import _cluster_parts, is_cluster_url
from worker.queue.keys import QueueKeys


def _slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.mark.parametrize("model", ["tiny-llama", "org/Model-7B", "llama3:8b", "we{ird}", "a b%"])
def test_a_models_keys_share_one_slot_and_the_deployment_keys_another(model: str) -> None:
    keys = QueueKeys(prefix="p", model=model)
    together = [keys.interactive, keys.lane(1_800_000_000), keys.lane(7), keys.unlaned_batch,
                keys.dead, keys.suspects, keys.carried, keys.carried_ready, keys.lanes,
                keys.lane_work, keys.rates,
                keys.admission_probe]  # scripts and transactions touch these together
    assert len({_slot(k) for k in together}) == 1
    assert all(k.startswith(keys.model_tag + ":") for k in together)
    assert keys.model_tag.count("{") == 1 and keys.model_tag.count("}") == 1
    deployment = [keys.cancels, keys.cancels_at, keys.reconcile_lock, keys.consumer_lock("c"),
                  keys.finalize_lock("b")]
    assert {_slot(k) for k in deployment} == {_slot("{p}")}
    assert "{" not in keys.deltas("j") and "{" not in keys.rate("t", 1)  # spread, one key each
    assert keys.class_of(keys.interactive) == "interactive" == keys.class_of(keys.stream("interactive"))
    assert keys.class_of(keys.lane(1_800_000_000)) == "batch"
    assert keys.lane_end(keys.lane(1_800_000_000)) == 1_800_000_000
    assert keys.lane_end(keys.interactive) is None and keys.lane_end(keys.unlaned_batch) is None
    with pytest.raises(ValueError, match="lane of its deadline"):
        keys.stream("batch")


def test_models_spread_over_slots_and_need_naming() -> None:
    slots = {_slot(QueueKeys(prefix="inflight", model=f"m{i}").lane(60)) for i in range(50)}
    assert len(slots) > 40  # one slot per model, not one for the deployment
    unbound = QueueKeys(prefix="inflight")
    with pytest.raises(ValueError, match="for_model"):
        unbound.lane(60)
    assert unbound.for_model("m").lane(60) == "{inflight:m}:jobs:batch:60"
    assert unbound.for_model("m").interactive == "{inflight:m}:jobs:interactive"
    assert unbound.cancels == "{inflight}:cancels"  # deployment keys need no model
    with pytest.raises(ValueError, match="braces"):
        QueueKeys(prefix="a{b}")
    with pytest.raises(ValueError, match="not a job stream"):
        unbound.for_model("m").class_of("{inflight:other}:jobs:batch")


def test_the_legacy_names_are_what_older_deployments_used() -> None:
    old = QueueKeys(prefix="inflight").legacy
    assert old.streams == ["inflight:jobs:interactive", "inflight:jobs:batch"]
    assert old.dead == "inflight:jobs:dead" and old.carried == "inflight:carried"
    assert old.class_of("inflight:jobs:batch") == "batch"


def test_cluster_urls() -> None:
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:6379/0")
    nodes, options = _cluster_parts("rediss+cluster://u:p%40ss@a:7000,b:7001")
    assert nodes == [("a", 7000), ("b", 7001)]
    assert options == {"username": "u", "password": "p@ss", "ssl": True}
    assert _cluster_parts("redis+cluster://a")[0] == [("a", 6379)]
    with pytest.raises(ValueError, match="database 0"):
        _cluster_parts("redis+cluster://a:1/3")
    with pytest.raises(ValueError, match="host:port"):
        _cluster_parts("redis+cluster://a:x")
