"""An independent mDNS browser (python-zeroconf, pinned in tests/requirements.txt)
for test_mdns.py: browses the given service types on one interface address
and prints one JSON line per event until it is killed:

    {"event": "ready"}
    {"event": "add", "type": T, "name": N, "port": P, "addresses": [...], "txt": {...}}
    {"event": "remove", "type": T, "name": N}

Usage: mdns_browser.py ADDRESS TYPE...
"""

import json
import sys
import threading

from zeroconf import IPVersion, ServiceBrowser, ServiceListener, Zeroconf


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


class Listener(ServiceListener):
    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        info = zc.get_service_info(type_, name, timeout=3000)
        if info is None:
            emit(event="add", type=type_, name=name, port=None, addresses=[], txt={})
            return
        txt = {k.decode(): (v.decode() if v is not None else None)
               for k, v in info.properties.items()}
        emit(event="add", type=type_, name=name, port=info.port,
             addresses=info.parsed_addresses(), txt=txt)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        emit(event="remove", type=type_, name=name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        emit(event="update", type=type_, name=name)


def main() -> None:
    address, types = sys.argv[1], sys.argv[2:]
    zc = Zeroconf(interfaces=[address], ip_version=IPVersion.V4Only)
    ServiceBrowser(zc, types, Listener())
    emit(event="ready")
    threading.Event().wait()


if __name__ == "__main__":
    main()
