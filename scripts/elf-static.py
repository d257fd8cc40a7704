#!/usr/bin/env python3
"""Exit 0 if each ELF file given is a static executable: no program
interpreter (PT_INTERP) and no dynamic section (PT_DYNAMIC), so it runs on a
board without any libc of its own. Prints the machine and the verdict."""
import struct
import sys

PT_DYNAMIC, PT_INTERP = 2, 3
MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x28: "arm"}


def check(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        return f"{path}: not an ELF file"
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    machine = struct.unpack_from(endian + "H", data, 18)[0]
    if is64:
        phoff, = struct.unpack_from(endian + "Q", data, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", data, 54)
    else:
        phoff, = struct.unpack_from(endian + "I", data, 28)
        phentsize, phnum = struct.unpack_from(endian + "HH", data, 42)
    types = [struct.unpack_from(endian + "I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    name = MACHINES.get(machine, hex(machine))
    if PT_INTERP in types or PT_DYNAMIC in types:
        return f"{path}: {name}, dynamically linked"
    print(f"{path}: {name}, static")
    return None


errors = [e for e in (check(p) for p in sys.argv[1:]) if e]
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors or len(sys.argv) < 2 else 0)
