"""Node-aware placement: a process's GPUs on one node, best fit, gangs per replica, fragmentation reasons."""

from __future__ import annotations

import pytest

from dlcloud.scheduler.planner import Plan, PlanConfig, Policy, plan
from tests.unit.scheduler.scenarios import NOW, gang, job, nodes, placed, running

ALL = list(Policy)


def node_of(gpus: tuple[int, ...], per_node: int = 4) -> set[int]:
    return {g // per_node for g in gpus}


@pytest.mark.parametrize("policy", ALL)
def test_a_process_gets_gpus_of_one_node_only(policy: Policy) -> None:
    # 3 free on node 0 (GPU 0 taken), 2 free on node 1: a 3-GPU job fits only node 0 though 5 are free
    held = [running("r0", "z", (0,)), running("r1", "z", (4, 5))]
    p = plan([job("three", gpus=3)], held, {}, nodes(2, 4), NOW, PlanConfig(policy=policy))
    assert p.placements == [("three", (1, 2, 3))]


@pytest.mark.parametrize("policy", ALL)
def test_best_fit_takes_the_fullest_node_that_fits(policy: Policy) -> None:
    # free: node 0 has 4, node 1 has 2 (GPUs 6, 7), node 2 has 3 (GPUs 9-11)
    held = [running("r1", "z", (4, 5)), running("r2", "z", (8,))]
    queue = [job("two", gpus=2), job("three", gpus=3), job("four", gpus=4)]
    p = plan(queue, held, {}, nodes(3, 4), NOW, PlanConfig(policy=policy))
    assert dict(p.placements) == {"two": (6, 7), "three": (9, 10, 11), "four": (0, 1, 2, 3)}


def test_without_best_fit_the_big_job_would_not_fit() -> None:
    # first fit would put the 1-GPU job on node 0 (4 free) and leave no node for the 4-GPU job
    held = [running("r", "z", (4, 5, 6))]
    p = plan([job("one"), job("four", gpus=4)], held, {}, nodes(2, 4), NOW)
    assert p.placements == [("one", (7,)), ("four", (0, 1, 2, 3))]


@pytest.mark.parametrize("policy", ALL)
def test_gang_replicas_each_on_one_node_spanning_nodes(policy: Policy) -> None:
    p = plan([gang("g", "a", 3, 2)], [running("r", "z", (0, 1))], {}, nodes(2, 4), NOW, PlanConfig(policy=policy))
    assert len(p.placements) == 1
    gid, gpus = p.placements[0]
    replicas = [gpus[i : i + 2] for i in range(0, 6, 2)]
    assert sorted(gpus) == [2, 3, 4, 5, 6, 7]
    assert all(len(node_of(r)) == 1 for r in replicas)


def fragmented() -> tuple[list, object]:
    # 2 free GPUs on each of 2 nodes: 4 free, but no node has 3
    return [running("r0", "z", (0, 1)), running("r1", "z", (4, 5))], nodes(2, 4)


def test_fifo_blocks_on_fragmentation_and_says_so() -> None:
    held, inv = fragmented()
    p = plan([job("three", gpus=3), job("one")], held, {}, inv, NOW)  # type: ignore[arg-type]
    assert placed(p) == [] and p.blocked_by == "three"
    assert p.wait_reasons["three"] == (
        "waiting for capacity: needs 3 GPU(s) on one node, at most 2 free on a node (4 free in all)"
    )


def test_gang_fragmentation_reason() -> None:
    # 6 GPUs free (2 on node 0, 4 on node 1): enough in all, but only one node can take a 3-GPU replica
    p = plan([gang("g", "a", 2, 3)], [running("r0", "z", (0, 1))], {}, nodes(2, 4), NOW)
    assert p.placements == [] and p.blocked_by == "g"
    assert p.wait_reasons["g"] == (
        "waiting for capacity: needs 2 worker(s) of 3 GPU(s), each replica on one node; "
        "the 6 free GPU(s) are spread too thin"
    )


@pytest.mark.parametrize("policy", [Policy.PRIORITY_BACKFILL, Policy.FAIR_SHARE, Policy.LAS])
def test_a_job_larger_than_any_node_waits_without_blocking(policy: Policy) -> None:
    p: Plan = plan([job("huge", gpus=5), job("small")], [], {}, nodes(2, 4), NOW, PlanConfig(policy=policy))
    assert placed(p) == ["small"]
    assert p.blocked_by is None
    assert p.wait_reasons["huge"].startswith("never fits: 5 GPU(s) on one node")


@pytest.mark.parametrize("policy", ALL)
def test_gpu_indices_are_never_double_assigned(policy: Policy) -> None:
    held = [running("r0", "z", (1, 6)), running("r1", "y", (9,))]
    queue = [job(f"j{i}", tenant=f"t{i % 3}", gpus=1 + i % 4) for i in range(12)]
    queue += [gang("g", "t1", 2, 2)]
    p = plan(queue, held, {}, nodes(4, 4), NOW, PlanConfig(policy=policy))
    got = [g for _, gs in p.placements for g in gs]
    assert len(got) == len(set(got)) and not set(got) & {1, 6, 9}
    for jid, gs in p.placements:
        if jid != "g":
            assert len(node_of(gs)) == 1
