"""The agent's view of the mesh: records, membership, peers, events, retiring."""
