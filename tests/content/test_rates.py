"""The fetcher measures the bytes/s each holder served (what the place record carries and the
policy's data term divides by): about the link's cap for a capped holder, nothing for one that
served too little to tell, smoothed over fetches."""

from __future__ import annotations

import asyncio

import pytest

from agent.content.fetch import MIN_MEASURED_BYTES, Fetcher, HolderRates
from agent.content.swarm import SwarmLimits
from agent.wire.codec import WireError, unpack
from agent.wire.place import PlaceRecord
from tests.content.memstore import MemStore
from tests.content.test_fetch import CHUNK, LocalHolder, dataset, full_store


def test_each_holder_rate_is_measured_within_its_cap() -> None:
    cap = 4 << 20
    m, chunks = dataset(48)  # 3 MiB: about 1.5 MiB from each of two holders
    holders = [LocalHolder(n, full_store(m, chunks)) for n in ("h1", "h2")]
    fetcher = Fetcher(MemStore(), limits=SwarmLimits(link_bytes_per_s=cap))
    asyncio.run(fetcher.fetch(m.digest, holders))
    rates = fetcher.rates.snapshot()
    served = {h.name: sum(h.served.values()) * CHUNK for h in holders}
    measured = {n for n, b in served.items() if b >= MIN_MEASURED_BYTES}
    assert measured and set(rates) == measured, (rates, served)
    for rate in rates.values():
        assert 0 < rate <= 2 * cap, rates


def test_a_holder_that_served_little_is_not_rated_and_rates_are_smoothed() -> None:
    m, chunks = dataset(4)
    fetcher = Fetcher(MemStore())
    asyncio.run(fetcher.fetch(m.digest, [LocalHolder("h1", full_store(m, chunks))]))
    assert fetcher.rates.snapshot() == {}
    rates = HolderRates()
    rates.note("h", 100.0)
    rates.note("h", 300.0)
    assert rates.snapshot() == {"h": 200.0}


def test_the_place_record_carries_the_rates_and_refuses_bad_ones() -> None:
    record = PlaceRecord(rates={"a": 1.5e6, "b": 2.0})
    payload, left_out = record.encode()
    assert left_out == 0
    assert PlaceRecord.decode(unpack(payload)).rates == {"a": 1.5e6, "b": 2.0}
    assert PlaceRecord.decode(unpack(PlaceRecord().encode()[0])).rates == {}
    for bad in ([["a", -1.0]], [["a", float("inf")]], [["a"]], [[1, 2.0]]):
        with pytest.raises(WireError):
            PlaceRecord.decode({"datasets": [], "rates": bad})
