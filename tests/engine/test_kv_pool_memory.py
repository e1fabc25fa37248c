"""The CPU KV pool commits memory only for the blocks written, and starts zeroed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.bench.machine import current_rss_bytes
from worker.engine.model_runner import kv_pool_tensor

MIB = 1 << 20


def test_cpu_pool_is_zeroed_and_committed_as_written() -> None:
    before = current_rss_bytes()
    # [layers, blocks, block_size, Hkv, D]: 4 x 1024 x 16 x 4 x 64 x 4 bytes = 64 MiB
    pool = kv_pool_tensor((4, 1024, 16, 4, 64), torch.float32, torch.device("cpu"))
    assert pool.is_contiguous() and pool.shape == (4, 1024, 16, 4, 64)
    assert current_rss_bytes() - before < 8 * MIB  # reserved, not committed
    pool[:, :256] = 1.0  # a quarter of the blocks written: 16 MiB
    grown = current_rss_bytes() - before
    assert 12 * MIB < grown < 32 * MIB, grown
    assert int(pool[:, 256:].count_nonzero()) == 0  # the untouched rest reads as zeros
    layer = pool[1]  # a view keeps the mapping alive after the pool's name is gone
    del pool
    assert float(layer[0].sum()) == 16 * 4 * 64


def _mapping_of(address: int) -> list[str]:
    """The /proc/self/smaps entry (header line first) of the mapping holding ``address``."""
    entry: list[str] = []
    found = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end perms ...
            if found:
                break
            start, end = (int(x, 16) for x in head.split("-"))
            found = start <= address < end
            entry = [line]
        elif found:
            entry.append(line)
    assert found, f"no mapping holds {address:#x}"
    return entry


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_the_lazy_pool_is_private_and_asks_for_huge_pages() -> None:
    """Private: not shared memory, which a forked child would write into and which takes no
    huge pages; and marked for transparent huge pages where the kernel offers them."""
    pool = kv_pool_tensor((2, 256, 16, 4, 64), torch.float32, torch.device("cpu"))  # 16 MiB
    entry = _mapping_of(pool.data_ptr())
    perms = entry[0].split()[1]
    assert perms.endswith("p"), entry[0]  # rw-p, not rw-s
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert "hg" in next(line for line in entry if line.startswith("VmFlags:")).split(), entry
    pool.fill_(1.0)  # still an ordinary tensor after the advice
    assert float(pool.sum()) == pool.numel()


def test_a_committed_cpu_pool_holds_its_memory_from_the_start() -> None:
    """Measured in a fresh process: a long-running one may hand the pool memory that is
    already resident, which no RSS reading can tell from a committed pool."""
    code = (
        "import torch\n"
        "from cli.bench.machine import current_rss_bytes\n"
        "from worker.engine.model_runner import kv_pool_tensor\n"
        "before = current_rss_bytes()\n"
        "pool = kv_pool_tensor((4, 1024, 16, 4, 64), torch.float32, torch.device('cpu'),\n"
        "                      committed=True)\n"
        "print((current_rss_bytes() - before) >> 20, int(pool.count_nonzero()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown_mib, nonzero = map(int, out.stdout.split())
    assert grown_mib >= 56 and nonzero == 0, out.stdout  # all 64 MiB written as zeros


def test_the_engine_orders_blocks_by_how_its_pool_is_committed() -> None:
    from worker.engine import EngineArgs, LLMEngine

    lazy = LLMEngine(EngineArgs(model="tiny-llama", num_kv_blocks=8))
    committed = LLMEngine(EngineArgs(model="tiny-llama", num_kv_blocks=8, commit_kv_pool=True))
    assert lazy.block_manager.never_used_last and not lazy.runner.kv_pool_committed
    assert committed.runner.kv_pool_committed and not committed.block_manager.never_used_last


def test_only_a_cpu_pool_can_be_committed_lazily() -> None:
    import pytest

    with pytest.raises(ValueError, match="only a CPU KV pool"):
        kv_pool_tensor((2, 4), torch.float32, torch.device("meta"))
    assert kv_pool_tensor((2, 4), torch.float32, torch.device("meta"), committed=True).shape == (2, 4)
