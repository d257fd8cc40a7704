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
