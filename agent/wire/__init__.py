"""Shoal's wire contract: every gossip record and API document, one typed definition each.

- :mod:`agent.wire.codec`: the version, the record size limit, msgpack framing and the typed
  field readers every decoder uses (a field of the wrong type is refused, naming the field);
- :mod:`agent.wire.records`: what agents gossip (``telemetry``, ``node``, ``events``,
  ``job/<id>``; ``sub/<id>`` stays the operator's sealed envelope), and
  :mod:`agent.wire.inventory`: ``inventory`` and its parts;
- :mod:`agent.wire.documents`: what the HTTP API answers (``/v1/nodes``, ``/v1/jobs``,
  ``/v1/events``, ``/healthz``) and the bodies of the calls between agents (``replicate``,
  ``adopt``, ``start``, ``stop``, ``status``, ``report``).

Every definition is an immutable ``typing.NamedTuple`` (``DeviceDoc``, whose ``index`` would
shadow ``tuple.index``, a frozen dataclass): a frozen, slotted dataclass class costs ~20 KB of an
agent's memory, a named tuple ~7 KB, and the agent's memory has a bar (60 MB at 32 agents).

Compatibility rules, the same for every kind: a reader ignores the fields it does not know (a
newer agent's additions) and takes a missing field as unknown (``None``) or its default (an
older agent's record), so agents of neighbouring versions run side by side through a rolling
upgrade. A job spec is the exception: an agent never runs a job it does not fully understand
(``agent.job.jobspec``: the features a spec uses, and the spec version that brings them).
"""
