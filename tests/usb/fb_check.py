#!/usr/bin/env python3
"""Draws a known pattern into a Linux framebuffer and checks a `framebuffer:`
reply against it (used by devio-vm.sh inside the VM).

    fb_check.py draw /dev/fbN          draw the pattern, print WIDTHxHEIGHT BPP
    fb_check.py check /dev/fbN REPLY   decode REPLY (the stream's bytes), compare
    fb_check.py ppm /dev/fbN IMAGE     compare `oxadb framebuffer IMAGE`'s PPM

The geometry comes from the kernel itself (FBIOGET_VSCREENINFO and
FBIOGET_FSCREENINFO, decoded here from linux/fb.h, independently of the
daemon); the reply is read as AOSP's framebuffer_service.cpp writes it:
14 little-endian u32 (version 2, bpp, colour space, size, width, height,
red offset/length, blue offset/length, green offset/length, alpha
offset/length), then width x height pixels, rows without padding.
"""

from __future__ import annotations

import fcntl
import struct
import sys

FBIOGET_VSCREENINFO = 0x4600
FBIOGET_FSCREENINFO = 0x4602


def geometry(dev: str) -> dict:
    with open(dev, "rb") as f:
        var = fcntl.ioctl(f, FBIOGET_VSCREENINFO, bytes(160))
        fix = fcntl.ioctl(f, FBIOGET_FSCREENINFO, bytes(80))
    v = struct.unpack("<8I12I", var[:80])
    xres, yres, _xv, _yv, xoff, yoff, bpp, _gray = v[:8]
    bits = v[8:]
    channels = {name: (bits[3 * i], bits[3 * i + 1])
                for i, name in enumerate(("red", "green", "blue", "alpha"))}
    line_length = struct.unpack_from("<I", fix, 48)[0]  # after id, smem_start, 4 u32, 3 u16 + pad
    return dict(width=xres, height=yres, bpp=bpp, line_length=line_length,
                start=yoff * line_length + xoff * bpp // 8, **channels)


def pixel(g: dict, x: int, y: int) -> bytes:
    """The pattern: each channel a different function of x and y, at full
    channel width, packed at the kernel's offsets."""
    values = {"red": x * 7 + y, "green": y * 5 + x * 3, "blue": x ^ y, "alpha": 0xff}
    word = 0
    for name, value in values.items():
        offset, length = g[name]
        if length:
            word |= (value & ((1 << length) - 1)) << offset
    return word.to_bytes(g["bpp"] // 8, "little")


def frame(g: dict) -> bytes:
    return b"".join(pixel(g, x, y) for y in range(g["height"]) for x in range(g["width"]))


def draw(dev: str) -> None:
    g = geometry(dev)
    row = g["width"] * g["bpp"] // 8
    image = frame(g)
    with open(dev, "r+b", buffering=0) as f:
        for y in range(g["height"]):
            f.seek(g["start"] + y * g["line_length"])
            f.write(image[y * row:(y + 1) * row])
    print(f"{g['width']}x{g['height']} {g['bpp']}")


def check(dev: str, reply_path: str) -> None:
    g = geometry(dev)
    with open(reply_path, "rb") as f:
        reply = f.read()
    assert len(reply) >= 56, f"reply of {len(reply)} bytes, no header: {reply[:200]!r}"
    (version, bpp, _colour_space, size, width, height, r_off, r_len, b_off, b_len,
     g_off, g_len, a_off, a_len) = struct.unpack_from("<14I", reply)
    want = dict(version=2, bpp=g["bpp"], size=g["width"] * g["height"] * g["bpp"] // 8,
                width=g["width"], height=g["height"], red=g["red"], blue=g["blue"],
                green=g["green"], alpha=g["alpha"])
    got = dict(version=version, bpp=bpp, size=size, width=width, height=height,
               red=(r_off, r_len), blue=(b_off, b_len), green=(g_off, g_len),
               alpha=(a_off, a_len))
    assert got == want, f"header {got} != {want}"
    pixels = reply[56:]
    assert len(pixels) == size, f"{len(pixels)} pixel bytes after the header, want {size}"
    expected = frame(g)
    if pixels != expected:
        step = bpp // 8
        first = next(i for i in range(len(pixels)) if pixels[i] != expected[i]) // step
        x, y = first % width, first // width
        raise AssertionError(
            f"pixel ({x},{y}) is {pixels[first * step:(first + 1) * step].hex()}, "
            f"drawn {expected[first * step:(first + 1) * step].hex()}")
    print(f"framebuffer: {width}x{height}, {bpp} bpp, red {r_off}/{r_len} green {g_off}/{g_len} "
          f"blue {b_off}/{b_len} alpha {a_off}/{a_len}, {size} pixel bytes identical")


def check_ppm(dev: str, image_path: str) -> None:
    g = geometry(dev)
    with open(image_path, "rb") as f:
        image = f.read()
    head = f"P6\n{g['width']} {g['height']}\n255\n".encode()
    assert image.startswith(head), f"PPM header {image[:20]!r}, want {head!r}"
    rgb = image[len(head):]
    # The pattern's values scaled from each channel's width to 8 bits.
    scale = {name: (1 << g[name][1]) - 1 for name in ("red", "green", "blue")}
    expected = bytearray()
    for y in range(g["height"]):
        for x in range(g["width"]):
            for name, value in (("red", x * 7 + y), ("green", y * 5 + x * 3), ("blue", x ^ y)):
                expected.append((value & scale[name]) * 255 // scale[name])
    assert rgb == bytes(expected), "the PPM's pixels differ from the pattern drawn"
    print(f"PPM {g['width']}x{g['height']}: every pixel's red, green and blue as drawn")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "draw":
        draw(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "ppm":
        check_ppm(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
