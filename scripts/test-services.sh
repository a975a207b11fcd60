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
# Starters of services that sit in front of another one (PgBouncer needs
# PostgreSQL): a service script appends its start function here instead of
# starting at once, and they run after every script has been sourced.
LEASEHOLD_LATE_STARTS=()
}

# A free TCP port on 127.0.0.1.
leasehold_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
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
