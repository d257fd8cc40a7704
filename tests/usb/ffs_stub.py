#!/usr/bin/env python3
"""A test-only FunctionFS function that looks like an ADB interface and
answers nothing: it proves the USB rig (dummy_hcd, configfs, FunctionFS,
the host's enumeration) without oxadbd.

    ffs_stub.py FFS_DIR

Writes FunctionFS v2 descriptors (full, high and super speed: one interface,
class 0xff subclass 0x42 protocol 1, a bulk OUT and a bulk IN endpoint) and
the strings ("ADB Interface") to FFS_DIR/ep0, prints "READY", then prints
every ep0 event and every transfer read from ep1 (bulk OUT), one line each:

    event ENABLE
    ep1 24 434e584e...            (hex of what arrived)
    ep1 packet CNXN arg0=0x01000000 arg1=4096 len=183 ...  (if it parses as an ADB header)

It never writes to ep2 (bulk IN). Standard library only. Stops on SIGTERM.
"""

import os
import struct
import sys
import threading

# <linux/usb/functionfs.h>
DESCRIPTORS_MAGIC_V2 = 3
STRINGS_MAGIC = 2
HAS_FS_DESC, HAS_HS_DESC, HAS_SS_DESC = 1, 2, 4
EVENT_NAMES = ["BIND", "UNBIND", "ENABLE", "DISABLE", "SETUP", "SUSPEND", "RESUME"]
EVENT_SIZE = 12  # struct usb_functionfs_event: 8 bytes of setup request, type, 3 pad

# <linux/usb/ch9.h>
DT_INTERFACE, DT_ENDPOINT, DT_SS_ENDPOINT_COMP = 4, 5, 0x30
XFER_BULK = 2
EP_OUT, EP_IN = 0x01, 0x82  # ep1 and ep2 of FFS_DIR, in descriptor order

ADB_CLASS, ADB_SUBCLASS, ADB_PROTOCOL = 0xFF, 0x42, 0x01


def interface():
    # bLength, bDescriptorType, bInterfaceNumber, bAlternateSetting,
    # bNumEndpoints, class, subclass, protocol, iInterface (string 1)
    return struct.pack("<9B", 9, DT_INTERFACE, 0, 0, 2, ADB_CLASS, ADB_SUBCLASS, ADB_PROTOCOL, 1)


def endpoint(address, max_packet):
    # The 7-byte form (no audio fields): bInterval 0 for bulk.
    return struct.pack("<BBBBHB", 7, DT_ENDPOINT, address, XFER_BULK, max_packet, 0)


def ss_companion():
    # bMaxBurst 0 (one packet per burst), bmAttributes 0 (no streams), wBytesPerInterval 0 (bulk)
    return struct.pack("<BBBBH", 6, DT_SS_ENDPOINT_COMP, 0, 0, 0)


def descriptors():
    fs = interface() + endpoint(EP_OUT, 64) + endpoint(EP_IN, 64)
    hs = interface() + endpoint(EP_OUT, 512) + endpoint(EP_IN, 512)
    ss = (interface() + endpoint(EP_OUT, 1024) + ss_companion()
          + endpoint(EP_IN, 1024) + ss_companion())
    counts = struct.pack("<3I", 3, 3, 5)
    body = counts + fs + hs + ss
    flags = HAS_FS_DESC | HAS_HS_DESC | HAS_SS_DESC
    return struct.pack("<3I", DESCRIPTORS_MAGIC_V2, 12 + len(body), flags) + body


def strings():
    lang = struct.pack("<H", 0x0409) + b"ADB Interface\0"
    return struct.pack("<4I", STRINGS_MAGIC, 16 + len(lang), 1, 1) + lang


def say(line):
    print(line, flush=True)


def watch_ep0(fd):
    while True:
        try:
            data = os.read(fd, EVENT_SIZE * 4)
        except OSError as e:
            say(f"ep0 read failed: {e}")
            return
        for i in range(0, len(data) - EVENT_SIZE + 1, EVENT_SIZE):
            kind = data[i + 8]
            name = EVENT_NAMES[kind] if kind < len(EVENT_NAMES) else f"type {kind}"
            extra = f" request {data[i:i + 8].hex()}" if name == "SETUP" else ""
            say(f"event {name}{extra}")


def describe_adb_header(data):
    """One line for a 24-byte ADB message header, or None."""
    if len(data) != 24:
        return None
    cmd, arg0, arg1, length, check, magic = struct.unpack("<6I", data)
    if magic != cmd ^ 0xFFFFFFFF:
        return None
    name = struct.pack("<I", cmd).decode("ascii", "replace")
    return f"ep1 packet {name} arg0=0x{arg0:08x} arg1={arg1} len={length} check=0x{check:08x}"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ffs_stub.py FFS_DIR")
    ffs = sys.argv[1]
    try:
        ep0 = os.open(os.path.join(ffs, "ep0"), os.O_RDWR)
    except OSError as e:
        sys.exit(f"ffs_stub: cannot open {ffs}/ep0: {e} (is functionfs mounted there?)")
    try:
        os.write(ep0, descriptors())
    except OSError as e:
        sys.exit(f"ffs_stub: the kernel rejected the descriptors written to {ffs}/ep0: {e}")
    try:
        os.write(ep0, strings())
    except OSError as e:
        sys.exit(f"ffs_stub: the kernel rejected the strings written to {ffs}/ep0: {e}")
    threading.Thread(target=watch_ep0, args=(ep0,), daemon=True).start()
    # ep2 is opened (as a daemon would) but never written to.
    bulk_out = os.open(os.path.join(ffs, "ep1"), os.O_RDONLY)
    bulk_in = os.open(os.path.join(ffs, "ep2"), os.O_WRONLY)
    say("READY")
    while True:
        try:
            # A read is one USB transfer: it ends at a short packet.
            data = os.read(bulk_out, 16384)
        except OSError as e:
            # ESHUTDOWN while the function is disabled (unbound, not yet
            # configured): wait for the next ENABLE.
            say(f"ep1 read: {e}")
            threading.Event().wait(0.5)
            continue
        say(f"ep1 {len(data)} {data.hex()}")
        line = describe_adb_header(data)
        if line:
            say(line)
        else:
            text = data.rstrip(b"\0")
            if text.isascii() and text.decode().isprintable():
                say("ep1 text " + text.decode())
    os.close(bulk_in)


if __name__ == "__main__":
    main()
