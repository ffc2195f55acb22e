"""The test servers' own helpers (tests/servers.py): what they promise the tests that use them."""

from __future__ import annotations

import servers


def test_cluster_ports_never_give_one_node_the_port_of_another_nodes_bus(monkeypatch):
    """A Redis Cluster node listens on its port and on port + 10000 (its bus): ports 25119 and
    35119 in one cluster make the second node fail at start ("Address already in use"), which
    failed a CI run."""
    picks = iter([25119, 35119, 30000, 15119 + 10000, 40000, 41000])
    monkeypatch.setattr("random.randrange", lambda lo, hi: next(picks))
    monkeypatch.setattr(servers, "_free", lambda port: True)
    ports = servers._cluster_ports(3)
    assert ports == [25119, 30000, 41000]  # 35119, 25119 and 40000: a port or bus taken
    buses = {p + 10000 for p in ports}
    assert not buses & set(ports)
