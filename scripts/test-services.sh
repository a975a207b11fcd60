# Starts (if needed) the servers the test suites use and exports their URLs.
#
#   source scripts/test-services.sh
#
# Each scripts/services/NAME.sh finds a running server or starts a private
# one, and exports LEASEHOLD_TEST_<NAME>. A server it cannot find or start
# is reported and left unset: the suites then skip, unless
# LEASEHOLD_REQUIRE_SERVERS=1 makes a missing server a failure.
# Servers this script starts are stopped by `leasehold_stop_services`.

LEASEHOLD_SERVICES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/services"
LEASEHOLD_STOP_HOOKS=()
# Starters of services that sit in front of another one (PgBouncer needs
# PostgreSQL): a service script appends its start function here instead of
# starting at once, and they run after every script has been sourced.
LEASEHOLD_LATE_STARTS=()

leasehold_stop_services() {
  local hook
  for hook in "${LEASEHOLD_STOP_HOOKS[@]}"; do
    eval "$hook" || true
  done
  LEASEHOLD_STOP_HOOKS=()
}

# A free TCP port on 127.0.0.1.
leasehold_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# leasehold_apt_install_in_ci SERVICE PACKAGE FINDER: in CI (CI=true, root,
# apt-get) installs the Debian PACKAGE unless the function FINDER already
# finds the server's binaries. Fails outside CI or when the install fails.
leasehold_apt_install_in_ci() {
  local service=$1 package=$2 finder=$3
  [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
  "$finder" >/dev/null && return 0
  echo "$service: installing the $package package for CI" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package") \
    >/dev/null 2>&1
}

for leasehold_service in "$LEASEHOLD_SERVICES_DIR"/*.sh; do
  [ -e "$leasehold_service" ] || continue
  # shellcheck source=/dev/null
  source "$leasehold_service"
done
for leasehold_service in "${LEASEHOLD_LATE_STARTS[@]}"; do
  "$leasehold_service" || true
done
unset leasehold_service
