#!/bin/sh
# Installs the NFQUEUE steering rules for vallumd with `vallumctl dataplane install` (idempotent:
# the VALLUM-NFQUEUE chain and its jumps are rewritten in one iptables-restore --noflush). Run as
# an init container with CAP_NET_ADMIN in the network namespace to protect: the pod's (sidecar)
# or the node's (node agent, hostNetwork). See docs/operations.md, "NFQUEUE mode".
#
#   VALLUM_CORES              workers = queues 0..N-1 (required; same value as vallumd's --cores)
#   VALLUM_STEER_HOOKS        filter chains to steer (default "INPUT OUTPUT"; node agent: FORWARD)
#   VALLUM_STEER_EXEMPT       TCP ports never steered (default "50051,9464": gRPC, metrics, probes)
#   VALLUM_STEER_FAMILIES     "4 6" (default), "4" or "6"
#   VALLUM_STEER_FAIL_CLOSED  "true": no --queue-bypass (packets are dropped while vallumd is down)
#   VALLUMCTL                 the vallumctl program (default: vallumctl on PATH)
#   $1 = remove               takes the rules out instead
#
# --queue-bypass (the default): while no vallumd worker is bound to a queue the kernel ACCEPTs its
# packets, so a restarting vallumd never blackholes the pod; it does mean traffic is unfiltered
# meanwhile.
set -eu

VALLUMCTL="${VALLUMCTL:-vallumctl}"
case "${VALLUM_STEER_FAMILIES:-4 6}" in
  "4") family=ipv4 ;;
  "6") family=ipv6 ;;
  *) family=both ;;
esac

if [ "${1:-}" = remove ]; then
  exec "$VALLUMCTL" dataplane uninstall --family "$family"
fi

: "${VALLUM_CORES:?set VALLUM_CORES to vallumd's worker count}"
chains=$(echo "${VALLUM_STEER_HOOKS:-INPUT OUTPUT}" | tr ' ' ',')
set -- --queues "$VALLUM_CORES" --chains "$chains" --family "$family" \
  --exempt-tcp-ports "${VALLUM_STEER_EXEMPT:-50051,9464}"
if [ "${VALLUM_STEER_FAIL_CLOSED:-false}" = true ]; then
  set -- "$@" --fail-closed
fi
exec "$VALLUMCTL" dataplane install "$@"
