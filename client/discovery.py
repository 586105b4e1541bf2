"""Find every daemon behind one DNS name: ``envd.connect("dns+tcp://NAME:PORT")``.

A Kubernetes headless Service (``clusterIP: None``) answers a DNS query for
its name with one address per ready pod; so does any name with several A or
AAAA records.  ``resolve`` turns such a URL into one ``tcp://ADDR:PORT``
endpoint per distinct address, sorted (IPv4 first, then IPv6, each in numeric
order) so that every trainer that resolves the same records connects in the
same order and so spreads its envs the same way.
"""
from __future__ import annotations

import ipaddress
import socket

from envd.errors import ConnectionLostError, InvalidArgumentError

#: The URL scheme of a DNS name that stands for every daemon it resolves to.
DNS_SCHEME = "dns+tcp://"


def is_dns_url(endpoint: object) -> bool:
    """Whether endpoint is a ``dns+tcp://NAME:PORT`` URL (see resolve)."""
    return isinstance(endpoint, str) and endpoint.startswith(DNS_SCHEME)


def parse_dns_url(url: str) -> tuple[str, int]:
    """(NAME, PORT) of ``dns+tcp://NAME:PORT``; InvalidArgumentError if malformed."""
    if not is_dns_url(url):
        raise InvalidArgumentError(
            f"a DNS endpoint must look like 'dns+tcp://NAME:PORT', got {url!r}")
    rest = url[len(DNS_SCHEME):]
    name, sep, port = rest.rpartition(":")
    if name.startswith("[") and name.endswith("]"):  # an IPv6 literal, as in a URL
        name = name[1:-1]
    if not sep or not name or "/" in name or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(
            f"a DNS endpoint must look like 'dns+tcp://NAME:PORT' with a port in 1..65535, "
            f"got {url!r}")
    return name, int(port)


def _sort_key(address: str) -> tuple[int, int, str]:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # not expected from getaddrinfo; keep it, after the others
        return (9, 0, address)
    return (ip.version, int(ip), address)


def tcp_endpoint(address: str, port: int) -> str:
    """The ZeroMQ endpoint of an address: IPv6 addresses go in brackets."""
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


def resolve(url: str) -> list[str]:
    """Every daemon endpoint ``dns+tcp://NAME:PORT`` stands for: one
    ``tcp://ADDR:PORT`` per distinct A or AAAA address of NAME, sorted.

    Raises ConnectionLostError naming NAME when it does not resolve or
    resolves to no address (no daemon can be reached through it), and
    InvalidArgumentError when the URL is malformed."""
    name, port = parse_dns_url(url)
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ConnectionLostError(
            f"cannot resolve {name!r} (from {url}): {exc.strerror or exc}; no envd daemon "
            "to connect to (is the name right, and are the daemons' pods ready?)") from None
    addresses = {str(sockaddr[0]) for family, _, _, _, sockaddr in infos
                 if family in (socket.AF_INET, socket.AF_INET6)}
    if not addresses:
        raise ConnectionLostError(
            f"{name!r} (from {url}) resolves to no IPv4 or IPv6 address; no envd daemon "
            "to connect to (are the daemons' pods ready?)")
    return [tcp_endpoint(address, port) for address in sorted(addresses, key=_sort_key)]
