#!/usr/bin/env bash
# System packages the test suite needs: PostgreSQL (the postgres tier), Open MPI (MPI jobs, mpi4py),
# bubblewrap (the sandbox of user code), slirp4netns and nftables (job egress), iproute2, curl.
# As root on Debian/Ubuntu it installs what is missing; otherwise it only checks and says what to install.
# Each part is skipped quickly when already present, so running it again is cheap.
set -euo pipefail

can_install=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  can_install=1
fi
apt_updated=0
missing=0

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = 0 ]; then
    apt-get update -q
    apt_updated=1
  fi
  apt-get install -y -q --no-install-recommends "$@"
}

# -- PostgreSQL ------------------------------------------------------------------------------------
if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "system deps: PostgreSQL answers on 127.0.0.1:5432"
elif [ "$can_install" = 1 ]; then
  echo "system deps: installing PostgreSQL"
  apt_install postgresql postgresql-client
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  conf=/etc/postgresql/$ver/main/pg_hba.conf
  if ! grep -q "dlcloud-tests" "$conf"; then
    sed -i '1i host all all 127.0.0.1/32 trust # dlcloud-tests' "$conf"
    sed -i '1i local all all trust # dlcloud-tests' "$conf"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
  for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
  pg_isready -h 127.0.0.1 -p 5432
else
  echo "system deps: PostgreSQL is not reachable on 127.0.0.1:5432." >&2
  echo "  Install it (Debian: apt-get install postgresql) or set DLCLOUD_TEST_POSTGRES_URL." >&2
  missing=1
fi

# -- Open MPI (mpirun for MPI jobs; mpi4py loads its libmpi) -------------------------------------------
if command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  echo "system deps: $(mpirun --version 2>/dev/null | head -1)"
elif [ "$can_install" = 1 ]; then
  echo "system deps: installing Open MPI"
  apt_install openmpi-bin libopenmpi-dev
  mpirun --version | head -1
else
  echo "system deps: Open MPI's mpirun is missing." >&2
  echo "  Install it (Debian: apt-get install openmpi-bin libopenmpi-dev)." >&2
  missing=1
fi

# -- bubblewrap (the sandbox every job, build and model inspection runs in; docs/isolation.md) ---------
if command -v bwrap >/dev/null; then
  echo "system deps: $(bwrap --version)"
elif [ "$can_install" = 1 ]; then
  echo "system deps: installing bubblewrap"
  apt_install bubblewrap
  bwrap --version
else
  echo "system deps: bubblewrap (bwrap) is missing: jobs of tenants other than the bootstrap one are refused." >&2
  echo "  Install it (Debian: apt-get install bubblewrap)." >&2
  missing=1
fi

# -- slirp4netns and nftables (a job's egress when its policy is "internet" or an allow-list; docs/isolation.md) --
if command -v slirp4netns >/dev/null && command -v nft >/dev/null; then
  echo "system deps: $(slirp4netns --version | head -1), $(nft --version)"
elif [ "$can_install" = 1 ]; then
  echo "system deps: installing slirp4netns and nftables"
  apt_install slirp4netns nftables
else
  echo "system deps: slirp4netns or nft is missing: jobs can only have egress 'none' (their own network, no way out)." >&2
  echo "  Install them (Debian: apt-get install slirp4netns nftables)." >&2
  missing=1
fi

# unprivileged control planes need /dev/net/tun for slirp4netns: Debian's udev makes it 0666 (the device
# checks CAP_NET_ADMIN in the namespace a tap is made in); some containers leave it 0600
if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
  if [ "$(id -u)" = 0 ]; then
    chmod 0666 /dev/net/tun && echo "system deps: /dev/net/tun made 0666, as Debian's udev rule does"
  else
    echo "system deps: /dev/net/tun is not 0666: an unprivileged control plane cannot give jobs egress." >&2
  fi
fi

# -- iproute2 (the tests make a network namespace of their own to stand for a host outside) --------------
if command -v ip >/dev/null; then
  echo "system deps: $(ip -V)"
elif [ "$can_install" = 1 ]; then
  apt_install iproute2
else
  echo "system deps: iproute2 (ip) is missing: the egress tests are skipped." >&2
  missing=1
fi

# -- curl (the README's tour asks the model server with it: tests/e2e/test_readme_tour.py) ----------------
if command -v curl >/dev/null; then
  echo "system deps: $(curl --version | head -1)"
elif [ "$can_install" = 1 ]; then
  apt_install curl
else
  echo "system deps: curl is missing: the README's tour (tests/e2e/test_readme_tour.py) fails without it." >&2
  echo "  Install it (Debian: apt-get install curl)." >&2
  missing=1
fi

if [ "$missing" = 1 ] && [ "${CI:-}" = "true" ]; then exit 1; fi
exit 0
