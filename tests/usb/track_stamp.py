#!/usr/bin/env python3
"""Timestamps what `adb track-devices` prints: adb dumps the server's
messages as they come (four hex digits of length, then the device list), so
this reads them from stdin and writes one line per message to stdout:
`EPOCH_MICROSECONDS line|line|...`, tabs in the lines made spaces (an
empty list is the time alone).
The USB server test (tests/usb/server-usb.sh) reads when a device left and
came back from it."""

import sys
import time


def read_exactly(stream, n):
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main():
    stream = sys.stdin.buffer
    while True:
        length = read_exactly(stream, 4)
        if length is None:
            return
        payload = read_exactly(stream, int(length, 16))
        if payload is None:
            return
        lines = payload.decode("utf-8", "replace").replace("\t", " ").splitlines()
        sys.stdout.write(f"{time.time_ns() // 1000} {'|'.join(lines)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
