#!/bin/sh
# The PostgreSQL store tests (tests/pg.py) start a throwaway cluster of Debian's PostgreSQL 15
# with its own initdb and postgres, on a Unix socket and 127.0.0.1. Installs the server when
# missing and we may (root with apt-get); otherwise says why not (the tests then skip with that
# reason).
set -eu
BIN=/usr/lib/postgresql/15/bin
if [ -x "$BIN/initdb" ] && [ -x "$BIN/postgres" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's postgresql-15 for the PostgreSQL store tests..."
    apt-get update -qq >/dev/null
    # policy-rc.d 101: the package must not start the system's cluster on port 5432 (the tests
    # start their own, in a temporary directory).
    policy=/usr/sbin/policy-rc.d
    created=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        created=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        postgresql-15 >/dev/null
    if [ -n "$created" ]; then
        rm -f "$policy"
    fi
else
    echo "postgresql-15 is not installed and cannot be installed here (needs root and apt-get):"
    echo "the PostgreSQL store tests will skip with that reason."
fi
