"""dns+tcp://NAME:PORT stands for every daemon NAME resolves to: every A and
AAAA address, de-duplicated and sorted, as tcp://ADDR:PORT endpoints; a name
that resolves to nothing is a ConnectionLostError naming it."""
from __future__ import annotations

import socket

import pytest

import envd
from envd.client import discovery


def fake_getaddrinfo(table):
    """A getaddrinfo answering from table (name -> addresses), as the system
    one does: one entry per address (and the same address repeated for other
    socket types, which resolve must fold)."""
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos = []
        for address in table[host]:
            fam = socket.AF_INET6 if ":" in address else socket.AF_INET
            sockaddr = (address, port, 0, 0) if fam == socket.AF_INET6 else (address, port)
            infos.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
            infos.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return infos
    return getaddrinfo


def test_every_address_deduplicated_and_sorted(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo({
        "envd-headless.default.svc": ["10.0.0.12", "fd00::2", "10.0.0.3", "10.0.0.12",
                                      "10.0.0.100", "fd00::10"]}))
    assert discovery.resolve("dns+tcp://envd-headless.default.svc:5555") == [
        "tcp://10.0.0.3:5555", "tcp://10.0.0.12:5555", "tcp://10.0.0.100:5555",
        "tcp://[fd00::2]:5555", "tcp://[fd00::10]:5555"]


def test_the_order_does_not_depend_on_the_resolver_order(monkeypatch):
    addresses = ["10.1.0.7", "10.1.0.5", "10.1.0.6"]
    results = []
    for order in (addresses, addresses[::-1], sorted(addresses)):
        monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo({"pods": order}))
        results.append(discovery.resolve("dns+tcp://pods:7000"))
    assert results[0] == results[1] == results[2] == [
        "tcp://10.1.0.5:7000", "tcp://10.1.0.6:7000", "tcp://10.1.0.7:7000"]


def test_a_name_that_does_not_resolve_is_a_connection_error_naming_it(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo({"empty": []}))
    with pytest.raises(envd.ConnectionLostError, match="'nowhere.invalid'"):
        discovery.resolve("dns+tcp://nowhere.invalid:5555")
    with pytest.raises(envd.ConnectionLostError, match="'empty' .*resolves to no"):
        discovery.resolve("dns+tcp://empty:5555")
    # envd.connect says the same, before any connection is tried
    with pytest.raises(envd.ConnectionLostError, match="'nowhere.invalid'"):
        envd.connect("dns+tcp://nowhere.invalid:5555", timeout=1)


@pytest.mark.parametrize("url", ["dns+tcp://name", "dns+tcp://name:", "dns+tcp://:5555",
                                 "dns+tcp://name:0", "dns+tcp://name:70000",
                                 "dns+tcp://name:port", "dns+tcp://name/x:5555", "tcp://name:5"])
def test_malformed_urls_are_invalid_arguments(url):
    with pytest.raises(envd.InvalidArgumentError, match="dns\\+tcp://NAME:PORT"):
        discovery.parse_dns_url(url)


def test_ipv6_literal_in_brackets(monkeypatch):
    assert discovery.parse_dns_url("dns+tcp://[::1]:5555") == ("::1", 5555)
    assert discovery.tcp_endpoint("::1", 5555) == "tcp://[::1]:5555"
    assert discovery.tcp_endpoint("127.0.0.1", 5555) == "tcp://127.0.0.1:5555"


def test_localhost_resolves_for_real():
    endpoints = discovery.resolve("dns+tcp://localhost:6553")
    assert endpoints, "localhost resolves to nothing"
    assert endpoints == sorted(set(endpoints), key=endpoints.index)  # no repeats
    assert set(endpoints) <= {"tcp://127.0.0.1:6553", "tcp://[::1]:6553"}
    # IPv4 first: the order is fixed, whatever the resolver's preference
    assert endpoints[0] == "tcp://127.0.0.1:6553" or endpoints == ["tcp://[::1]:6553"]


def test_is_dns_url():
    assert discovery.is_dns_url("dns+tcp://a:1")
    assert not discovery.is_dns_url("tcp://a:1")
    assert not discovery.is_dns_url(None)
    assert not discovery.is_dns_url(["dns+tcp://a:1"])
