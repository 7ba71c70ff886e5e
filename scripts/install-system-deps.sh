#!/usr/bin/env bash
# System packages the test suite needs. As root on Debian/Ubuntu it installs what is missing;
# otherwise it only checks and says what to install.
set -euo pipefail

need_pg=0
if ! (command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432); then
  need_pg=1
fi

if [ "$need_pg" = 0 ]; then
  echo "system deps: PostgreSQL answers on 127.0.0.1:5432"
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "system deps: installing PostgreSQL"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends postgresql postgresql-client
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
  if [ "${CI:-}" = "true" ]; then exit 1; fi
fi
