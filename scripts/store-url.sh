# Sourced by the example runners (scripts/examples.sh, scripts/node-examples.sh).

# store_url LABEL NAME: the store URL in LEASEHOLD_TEST_NAME, or empty (and a
# notice starting with LABEL) if none; a failure instead when
# LEASEHOLD_REQUIRE_SERVERS=1.
store_url() {
  local label=$1 name="LEASEHOLD_TEST_$2"
  if [ -n "${!name:-}" ]; then
    echo "${!name}"
  elif [ "${LEASEHOLD_REQUIRE_SERVERS:-0}" = 1 ]; then
    echo "$label: $name is not set and LEASEHOLD_REQUIRE_SERVERS=1" >&2
    return 1
  else
    echo "$label: $name is not set; skipping the examples on that store" >&2
  fi
}
