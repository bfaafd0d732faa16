#!/bin/sh
# The remote-host tests (tests/remote/) start Debian's OpenSSH server on 127.0.0.1 and
# reach it with its client. Installs both when missing and we may (root with apt-get);
# otherwise says why not (the tests then skip with that reason).
set -eu
if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's openssh-server and openssh-client for the remote-host tests..."
    apt-get update -qq >/dev/null
    # policy-rc.d 101: the package must not start a system sshd on port 22 (the tests start
    # their own, on a random port of 127.0.0.1).
    policy=/usr/sbin/policy-rc.d
    created=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        created=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        openssh-server openssh-client >/dev/null
    if [ -n "$created" ]; then
        rm -f "$policy"
    fi
else
    echo "openssh-server is not installed and cannot be installed here (needs root and apt-get):"
    echo "the remote-host tests will skip with that reason."
fi
