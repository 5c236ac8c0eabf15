#!/bin/sh
# Installs the NFQUEUE steering rules for vallumd (idempotent: the chain is flushed and refilled,
# the jumps are added once). Run as an init container with CAP_NET_ADMIN in the network namespace
# to protect: the pod's (sidecar) or the node's (node agent, hostNetwork).
#
#   VALLUM_CORES          workers = queues 0..N-1 (required; same value as vallumd's --cores)
#   VALLUM_STEER_HOOKS    mangle hooks to steer (default "PREROUTING OUTPUT"; node agent: FORWARD)
#   VALLUM_STEER_EXEMPT   TCP ports never steered (default "50051,9464": gRPC, metrics, probes)
#   VALLUM_STEER_FAMILIES "4 6" (default) or "4"
#   $1 = remove          deletes the jumps and the chain instead
#
# --queue-bypass: while no vallumd worker is bound to a queue the kernel ACCEPTs its packets, so a
# restarting vallumd never blackholes the pod; it does mean traffic is unfiltered meanwhile.
set -eu

: "${VALLUM_CORES:?set VALLUM_CORES to vallumd's worker count}"
HOOKS="${VALLUM_STEER_HOOKS:-PREROUTING OUTPUT}"
EXEMPT="${VALLUM_STEER_EXEMPT:-50051,9464}"
FAMILIES="${VALLUM_STEER_FAMILIES:-4 6}"
CHAIN=VALLUM-STEER

if [ "$VALLUM_CORES" -gt 1 ]; then
  QUEUE="--queue-balance 0:$((VALLUM_CORES - 1))"
else
  QUEUE="--queue-num 0"
fi

for fam in $FAMILIES; do
  if [ "$fam" = 6 ]; then ipt=ip6tables; else ipt=iptables; fi
  for hook in $HOOKS; do
    case "$hook" in
      OUTPUT | POSTROUTING) lo="! -o lo" ;;
      *) lo="! -i lo" ;;
    esac
    # shellcheck disable=SC2086
    if [ "${1:-}" = remove ]; then
      $ipt -w -t mangle -D "$hook" $lo -j "$CHAIN" 2>/dev/null || true
    elif ! $ipt -w -t mangle -C "$hook" $lo -j "$CHAIN" 2>/dev/null; then
      $ipt -w -t mangle -N "$CHAIN" 2>/dev/null || true
      $ipt -w -t mangle -A "$hook" $lo -j "$CHAIN"
    fi
  done
  if [ "${1:-}" = remove ]; then
    $ipt -w -t mangle -F "$CHAIN" 2>/dev/null || true
    $ipt -w -t mangle -X "$CHAIN" 2>/dev/null || true
    continue
  fi
  $ipt -w -t mangle -N "$CHAIN" 2>/dev/null || $ipt -w -t mangle -F "$CHAIN"
  $ipt -w -t mangle -A "$CHAIN" -p tcp -m multiport --dports "$EXEMPT" -j RETURN
  $ipt -w -t mangle -A "$CHAIN" -p tcp -m multiport --sports "$EXEMPT" -j RETURN
  # shellcheck disable=SC2086
  $ipt -w -t mangle -A "$CHAIN" -j NFQUEUE $QUEUE --queue-bypass
  echo "nfqueue-steering: IPv$fam $HOOKS -> $CHAIN -> NFQUEUE $QUEUE --queue-bypass (exempt tcp $EXEMPT)"
done
