# Shell helpers shared by scripts/test.sh and the installers it runs.
# Source it after setting DIE_PREFIX (the name errors are reported under).

die() {
    printf '\n%s: %s\n' "${DIE_PREFIX:-ERROR}" "$*" >&2
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run: $*"
    fi
}

# Installs Debian packages, running `apt-get update` at most once per script
# run, scripts it starts included (the package lists do not change within one run).
APT_LISTS_UPDATED="${APT_LISTS_UPDATED:-0}"
apt_install() {
    if [ "${APT_LISTS_UPDATED}" -eq 0 ]; then
        as_root apt-get update
        export APT_LISTS_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}
