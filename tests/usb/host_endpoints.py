#!/usr/bin/env python3
"""Host-side endpoints a device must not reach unless a reverse forward
asked for them: a TCP port on 127.0.0.1, a Unix socket in the filesystem and
an abstract one. Each connection is logged and answered.

    host_endpoints.py PORT SOCKET_PATH ABSTRACT_NAME

Prints READY, then `accepted KIND` (tcp, unix, abstract) and `received
BYTES` for each connection. Standard library only. Stops on SIGTERM.
"""

import socket
import sys
import threading


def say(*words) -> None:
    print(*words, flush=True)


def serve(kind: str, listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        say("accepted", kind)
        conn.settimeout(10)
        try:
            say("received", repr(conn.recv(100)))
            conn.sendall(b"hello from the host")
        except OSError as error:
            say("error", kind, error)
        finally:
            conn.close()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(f"usage: {argv[0]} PORT SOCKET_PATH ABSTRACT_NAME", file=sys.stderr)
        return 2
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", int(argv[1])))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(argv[2])
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + argv[3])
    threads = []
    for kind, listener in (("tcp", tcp), ("unix", unix), ("abstract", abstract)):
        listener.listen(8)
        threads.append(threading.Thread(target=serve, args=(kind, listener), daemon=True))
    for thread in threads:
        thread.start()
    say("READY")
    threads[0].join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
