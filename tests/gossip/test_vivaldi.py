"""Vivaldi converges on a synthetic latency matrix; the suspicion timeout formula."""

from __future__ import annotations

import math
import random

from gossip.suspicion import Suspicion, suspicion_timeout_s
from gossip.vivaldi import VivaldiClient, VivaldiConfig


def test_converges_on_synthetic_matrix() -> None:
    rng = random.Random(42)
    n = 25
    # hosts on a 2-D plane (positions in ms) plus a per-host access latency
    pos = [(rng.uniform(0, 50), rng.uniform(0, 50)) for _ in range(n)]
    access = [rng.uniform(0.1, 2.0) for _ in range(n)]

    def rtt_s(i: int, j: int) -> float:
        return (math.dist(pos[i], pos[j]) + access[i] + access[j]) / 1000.0

    clients = [VivaldiClient(VivaldiConfig(), random.Random(i)) for i in range(n)]
    for _ in range(400):
        for i in range(n):
            j = rng.randrange(n - 1)
            j = j + 1 if j >= i else j
            clients[i].update(str(j), clients[j].coord, rtt_s(i, j))
    errors = [
        abs(clients[i].coord.distance_s(clients[j].coord) - rtt_s(i, j)) / rtt_s(i, j)
        for i in range(n)
        for j in range(n)
        if i != j
    ]
    errors.sort()
    assert errors[len(errors) // 2] < 0.10
    assert errors[int(len(errors) * 0.9)] < 0.35


def test_suspicion_timeout_shrinks_with_confirmations() -> None:
    assert suspicion_timeout_s(0, 3, 2.0, 8.0) == 8.0
    assert suspicion_timeout_s(1, 3, 2.0, 8.0) == 5.0  # 8 - log2/log4 * 6
    assert suspicion_timeout_s(3, 3, 2.0, 8.0) == 2.0
    assert suspicion_timeout_s(0, 0, 2.0, 8.0) == 2.0
    s = Suspicion.start("a", 10.0, 3, 2.0, 8.0)
    assert s.deadline == 18.0
    assert not s.confirm("a")
    assert s.confirm("b") and s.deadline == 15.0
    assert s.confirm("c") and s.confirm("d") and s.deadline == 12.0
    assert not s.confirm("e")


def test_last_look_runs_alongside_the_timeout() -> None:
    s = Suspicion.start("a", 10.0, 3, 2.0, 8.0, lead_s=0.85)
    assert s.due == 18.0 - 0.85  # the reliable last-look ping goes out before the timeout
    s.final_seq, s.final_sent_at = 7, 17.15
    assert s.due == 18.0  # then the verdict waits for the timeout itself
    s.confirm("b")  # a confirmation cannot cut the ping's own wait short
    assert s.deadline == 15.0 and s.due == 17.15 + 0.85


def test_the_measured_round_trip_is_the_median_of_the_recent_probes() -> None:
    client = VivaldiClient(VivaldiConfig(), random.Random(1))
    other = VivaldiClient(VivaldiConfig(), random.Random(2))
    assert client.measured_rtt_s("b") is None
    for rtt in (0.004, 0.002, 0.050, 0.003):  # one slow probe does not move the median
        client.update("b", other.coord, rtt)
    assert client.measured_rtt_s("b") == 0.003  # the filter's last three: 2, 50 and 3 ms
    client.drop("b")
    assert client.measured_rtt_s("b") is None


def test_the_measured_peers_are_those_with_samples_not_every_coordinate_held() -> None:
    client = VivaldiClient(VivaldiConfig(), random.Random(1))
    other = VivaldiClient(VivaldiConfig(), random.Random(2))
    client.update("a", other.coord, 0.0)  # a coordinate without a usable sample: not measured
    client.update("b", other.coord, 0.002)
    client.update("c", other.coord, 0.003)
    assert client.coordinate_of("a") is not None
    assert client.measured() == {"b", "c"}
    client.forget("b")  # it died: its samples go, its coordinate stays
    assert client.coordinate_of("b") is not None and client.measured() == {"c"}
    client.drop("c")
    assert client.measured() == frozenset()
