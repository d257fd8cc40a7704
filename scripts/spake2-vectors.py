#!/usr/bin/env python3
"""Makes the SPAKE2 test vectors of crates/pairing/src/spake2/tests.rs with
BoringSSL as the reference peer.

BoringSSL is Debian's android-libboringssl (the libcrypto adb links to), driven
through ctypes: SPAKE2_CTX_new, SPAKE2_generate_msg, SPAKE2_process_msg. Its
randomness cannot be chosen, so each vector pairs one BoringSSL side (random
message, recorded) with our side run with fixed random bytes (the
spake2_vector example): the vector holds our message and the key BoringSSL
derived from it, and the unit test checks that our side, given BoringSSL's
message, makes the same message and the same key.

    apt-get install android-libboringssl
    cargo build --release -p oxadb-pairing --example spake2_vector
    python3 scripts/spake2-vectors.py target/release/examples/spake2_vector
"""

import ctypes
import hashlib
import subprocess
import sys

LIB = "/usr/lib/x86_64-linux-gnu/android/libcrypto.so.0"
CLIENT_NAME = b"adb pair client\0"
SERVER_NAME = b"adb pair server\0"
ALICE, BOB = 0, 1


def boringssl_side(lib, role, password):
    me, them = (CLIENT_NAME, SERVER_NAME) if role == ALICE else (SERVER_NAME, CLIENT_NAME)
    ctx = lib.SPAKE2_CTX_new(role, me, len(me), them, len(them))
    assert ctx
    msg = ctypes.create_string_buffer(32)
    n = ctypes.c_size_t()
    assert lib.SPAKE2_generate_msg(ctx, msg, ctypes.byref(n), 32, password, len(password)) == 1
    return ctx, msg.raw[: n.value]


def boringssl_finish(lib, ctx, their):
    key = ctypes.create_string_buffer(64)
    n = ctypes.c_size_t()
    ok = lib.SPAKE2_process_msg(ctx, key, ctypes.byref(n), 64, their, len(their))
    lib.SPAKE2_CTX_free(ctx)
    assert ok == 1
    return key.raw[: n.value]


def main():
    example = sys.argv[1]
    lib = ctypes.CDLL(LIB)
    lib.SPAKE2_CTX_new.restype = ctypes.c_void_p
    lib.SPAKE2_CTX_new.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.c_char_p, ctypes.c_size_t]
    lib.SPAKE2_generate_msg.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                        ctypes.c_char_p, ctypes.c_size_t]
    lib.SPAKE2_process_msg.argtypes = lib.SPAKE2_generate_msg.argtypes
    lib.SPAKE2_CTX_free.argtypes = [ctypes.c_void_p]
    # Passwords as adb builds them: the code, then 64 bytes of TLS exported
    # keying material (here a fixed stand-in).
    for i, code in enumerate([b"123456", b"000000", b"987654", b"314159"]):
        password = code + hashlib.sha512(b"ekm %d" % i).digest()
        ours = "bob" if i % 2 == 0 else "alice"
        theirs = ALICE if ours == "bob" else BOB
        random = hashlib.sha512(b"random %d" % i).digest()
        ctx, their_msg = boringssl_side(lib, theirs, password)
        out = subprocess.run([example, ours, password.hex(), random.hex(), their_msg.hex()],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        fields = dict(line.split(" ", 1) for line in out.splitlines())
        key = boringssl_finish(lib, ctx, bytes.fromhex(fields["msg"]))
        assert key.hex() == fields["key"], f"vector {i}: keys differ"
        print(f"Vector {{ ours: Role::{ours.capitalize()}, password: \"{password.hex()}\",\n"
              f"    random: \"{random.hex()}\",\n"
              f"    peer_msg: \"{their_msg.hex()}\",\n"
              f"    msg: \"{fields['msg']}\",\n"
              f"    key: \"{key.hex()}\" }},")


if __name__ == "__main__":
    main()
