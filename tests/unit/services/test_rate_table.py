"""The rate limits' table shared by the API processes of one host (``services/rate_table.py``): two mappings of
one file (as two processes have) count one key's requests in one bucket; a refill is seen by both; a full table
takes over a bucket that refilled, else the one counted longest ago; a file of another size is refused. And a
second process for real: requests admitted in a child count against the parent's budget."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from dlcloud.errors import RateLimited
from dlcloud.schemas.users import Role
from dlcloud.services import rate_table
from dlcloud.services.admission import RateLimits
from dlcloud.services.auth import Caller
from dlcloud.services.rate_table import SharedBuckets
from dlcloud.settings import Settings


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict = {"data_dir": tmp_path, "api_rate_limit_per_key": 1.0, "api_rate_limit_per_key_burst": 3}
    return Settings(**{**values, **overrides})


CALLER = Caller("t1", "team", "u1", "alice", Role.MEMBER, "AK1")


def _admitted(limits: RateLimits, n: int) -> int:
    admitted = 0
    for _ in range(n):
        try:
            limits.admit(CALLER)
            admitted += 1
        except RateLimited:
            pass
    return admitted


def test_two_mappings_share_one_bucket(tmp_path: Path) -> None:
    path = tmp_path / "run" / "rate-limits"
    rate_table.create(path)
    settings = _settings(tmp_path, api_rate_limit_per_key=0.001)
    a, b = RateLimits(settings, SharedBuckets(path)), RateLimits(settings, SharedBuckets(path))
    assert _admitted(a, 2) == 2
    assert _admitted(b, 5) == 1  # the burst of 3 once, not once per mapping
    with pytest.raises(RateLimited):
        a.admit(CALLER)


def test_a_refill_is_seen_by_every_mapping(tmp_path: Path) -> None:
    path = tmp_path / "rate-limits"
    rate_table.create(path)
    one, two = SharedBuckets(path), SharedBuckets(path)
    with one.locked():
        slot = one.find("key", "AK1", 3, 1.0, now=100.0)
        one.write(slot, 0.0, 100.0)
    with two.locked():
        tokens, at = two.read(two.find("key", "AK1", 3, 1.0, now=101.5))
    assert (tokens, at) == (0.0, 100.0)  # the bucket as written; its refill is computed by the reader


def _small_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SharedBuckets:
    """A table of 4 slots, every bucket probing all of them."""
    monkeypatch.setattr(rate_table, "SLOTS", 4)
    monkeypatch.setattr(rate_table, "PROBES", 4)
    path = tmp_path / "rate-limits"
    rate_table.create(path)
    return SharedBuckets(path)


def test_a_full_table_takes_over_a_refilled_bucket_else_the_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _small_table(tmp_path, monkeypatch)
    with table.locked():
        slots = {}
        for i, key in enumerate("abcd"):
            slots[key] = table.find("key", key, 10, 1.0, now=0.0)
            table.write(slots[key], 0.0, float(i))  # empty buckets, counted at 0, 1, 2, 3
        assert len(set(slots.values())) == 4
        taken = table.find("key", "e", 10, 1.0, now=5.0)  # none refilled (10 tokens take 10 s): the oldest goes
        assert taken == slots["a"] and table.read(taken) == (10.0, 5.0)
        later = table.find("key", "f", 10, 1.0, now=20.0)  # by now all refilled: one of them is taken over
        assert later in slots.values()


def test_a_bucket_is_judged_refilled_by_its_own_burst_and_found_past_a_reusable_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _small_table(tmp_path, monkeypatch)
    with table.locked():
        tenant = table.find("tenant", "t1", 1000, 1.0, now=0.0)
        table.write(tenant, 300.0, 0.0)  # 700 tokens short of its burst of 1000
        others = {table.find("key", k, 200, 1.0, now=0.0) for k in "abc"}  # a key's burst is 200 only
        assert tenant not in others  # 300 tokens >= 200 would have read as "refilled" with the key's burst
        assert table.read(table.find("tenant", "t1", 1000, 1.0, now=0.0)) == (300.0, 0.0)
        for slot in others:
            table.write(slot, 0.0, 0.0)
        # the key buckets refill (200 s); the tenant's is still found where it is, never replaced by a fresh one
        assert table.read(table.find("tenant", "t1", 1000, 1.0, now=250.0)) == (300.0, 0.0)


def test_a_file_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rate-limits"
    path.write_bytes(b"x" * (rate_table.size() - 1))
    with pytest.raises(ValueError, match="not a rate-limit table"):
        SharedBuckets(path)


def _admit_in_child(data_dir: str, path: str, n: int, out: mp.Queue) -> None:
    limits = RateLimits(_settings(Path(data_dir), api_rate_limit_per_key=0.001), SharedBuckets(Path(path)))
    out.put(_admitted(limits, n))


def test_another_process_spends_the_same_budget(tmp_path: Path) -> None:
    path = tmp_path / "rate-limits"
    rate_table.create(path)
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    child = ctx.Process(target=_admit_in_child, args=(str(tmp_path), str(path), 2, out))
    child.start()
    assert out.get(timeout=60) == 2
    child.join(timeout=60)
    limits = RateLimits(_settings(tmp_path, api_rate_limit_per_key=0.001), SharedBuckets(path))
    assert _admitted(limits, 5) == 1
