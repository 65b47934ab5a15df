#!/usr/bin/env bash
# PostgreSQL 15's server binaries for the tests (engine/testing/postgres.py starts a throwaway server from
# them: initdb into a temporary folder, 127.0.0.1 only). Idempotent: uses an installed PostgreSQL 15
# when there is one, else installs Debian's postgresql-15. Under root it also makes sure an
# unprivileged `postgres` system user exists, since initdb refuses to run as root.
set -euo pipefail

want=15

has_tools() {
    [ -n "$1" ] && [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ -x "$1/postgres" ]
}

major_of() {
    "$1/postgres" --version 2>/dev/null | sed -E 's/^[^0-9]*([0-9]+).*/\1/'
}

find_bindir() {
    local candidates=()
    if [ -n "${FINALITY_PG_BINDIR:-}" ]; then candidates+=("$FINALITY_PG_BINDIR"); fi
    if command -v pg_config >/dev/null 2>&1; then candidates+=("$(pg_config --bindir 2>/dev/null || true)"); fi
    local d
    for d in /usr/lib/postgresql/*/bin; do candidates+=("$d"); done
    for d in "${candidates[@]}"; do
        if has_tools "$d" && [ "$(major_of "$d")" = "$want" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

if ! bindir="$(find_bindir)"; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-postgres: PostgreSQL $want server binaries not found and not root;" \
            "install them with: sudo apt-get install -y postgresql-$want" >&2
        exit 1
    fi
    echo "install-postgres: installing Debian's postgresql-$want"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "postgresql-$want" >/dev/null
    if ! bindir="$(find_bindir)"; then
        echo "install-postgres: postgresql-$want installed but its binaries were not found" >&2
        exit 1
    fi
fi

if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    # Debian's package creates it; a machine with hand-copied binaries may lack it.
    useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home --shell /usr/sbin/nologin postgres
fi

echo "install-postgres: PostgreSQL $("$bindir/postgres" --version | sed -E 's/^[^0-9]*//') at $bindir"
