"""Size limits of the static board daemons (scripts/release.sh), so that
growth is seen when it happens (docs/benchmarks.md, "Static board builds:
size and idle memory"): with every default feature at most 4.75 MiB (4.5
until the aarch64 daemon reached 4751384 bytes, with the `oxadb-delta:`
service in), and the
minimal variant (`VARIANTS=minimal`, no TLS, pairing or mDNS) at most
3.5 MiB, for aarch64 and armv7.

The binaries come from target/static/TARGET/ (OXADB_STATIC_DIR overrides);
scripts/test.sh builds them first. A missing binary is a failure, as is one
that is not a static executable of its target.
"""

from __future__ import annotations

import pytest

from test_static_qemu import static_file

MiB = 1 << 20
# (arch, file under target/static/TARGET/, limit in bytes)
LIMITS = [
    ("aarch64", "oxadbd", 4 * MiB + 3 * MiB // 4),
    ("armv7", "oxadbd", 4 * MiB + 3 * MiB // 4),
    ("aarch64", "oxadbd-minimal", 3 * MiB + MiB // 2),
    ("armv7", "oxadbd-minimal", 3 * MiB + MiB // 2),
]


@pytest.mark.parametrize("arch,name,limit", LIMITS, ids=[f"{a}-{n}" for a, n, _ in LIMITS])
def test_static_daemon_is_within_its_size_limit(arch, name, limit):
    exe = static_file(arch, name)
    size = exe.stat().st_size
    assert size <= limit, (
        f"{exe} is {size} bytes ({size / MiB:.2f} MiB), over its limit of {limit} bytes "
        f"({limit / MiB:.2f} MiB): find what grew with `cargo bloat --profile dist-syms` "
        f"(docs/benchmarks.md, \"Static board builds: size and idle memory\")"
    )
