"""The swarm benches' host-CPU figures: ``/proc/stat`` read as busy and total CPU seconds, and the sandboxed
bench's ramp (from the start until the last agent's first call) taken from the sampler's timeline."""

from __future__ import annotations

import pytest

from swarmyard.bench.swarm_sandboxed import _Sampler, host_cpu


def test_host_cpu_is_busy_within_total_and_grows() -> None:
    busy, total = host_cpu()
    assert 0 < busy <= total
    sum(i * i for i in range(200_000))  # some work of this process between the two reads
    busy2, total2 = host_cpu()
    assert busy2 >= busy and total2 > total


def test_the_ramp_ends_at_the_last_sample_before_the_moment_asked() -> None:
    sampler = _Sampler("test")
    # (seconds since the start, busy, total): 2 cores, fully busy for 2 s, then idle
    sampler.cpu = [(0.0, 100.0, 200.0), (1.0, 102.0, 202.0), (2.0, 104.0, 204.0), (3.0, 104.0, 206.0)]
    assert sampler.busy_until(2.5) == (4.0, 1.0)
    cpu_s, share = sampler.busy_until(10.0)
    assert cpu_s == 4.0 and share == pytest.approx(4 / 6)
    # before the first sample after the start: that sample, not nothing
    assert sampler.busy_until(0.2) == (2.0, 1.0)


def test_a_sampler_that_never_sampled_says_nothing() -> None:
    sampler = _Sampler("test")
    sampler.cpu = [(0.0, 100.0, 200.0)]
    assert sampler.busy_until(5.0) == (0.0, 0.0)
