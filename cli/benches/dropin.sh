#!/bin/sh
# 200 calls of `iptables -A` (separate processes) on a ruleset of N rules (default 10000):
# vallum-iptables against vallumd, and iptables-legacy / nft in a private netns (root), same run.
# Usage: cli/benches/dropin.sh [TARGET_DIR] [N]   (TARGET_DIR default target/release)
set -eu
T=${1:-target/release}; N=${2:-10000}; CALLS=200
W=$(mktemp -d); trap 'kill $VPID 2>/dev/null; rm -rf $W' EXIT
"$T/vallumd" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --cores 1 --db "$W/v.db" >"$W/log" 2>&1 &
VPID=$!
while ! grep -q "listening on" "$W/log"; do sleep 0.1; done
export VALLUM_SERVER=http://$(grep -o "listening on [0-9.:]*" "$W/log" | awk '{print $3}')
export VALLUM_RULESET=bench
mkdir "$W/bin"; for n in iptables iptables-restore; do ln -s "$(realpath "$T/vallum-iptables")" "$W/bin/$n"; done
{ echo '*filter'; i=0; while [ $i -lt $N ]; do echo "-A INPUT -s 10.$((i/65536%256)).$((i/256%256)).$((i%256)) -p tcp --dport 80 -j ACCEPT"; i=$((i+1)); done; echo COMMIT; } >"$W/base"
ms() { s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e-s)/1000/CALLS ))us/call; }
calls() { i=0; while [ $i -lt $CALLS ]; do "$@" -A INPUT -s 192.168.$((i/256)).$((i%256)) -j DROP; i=$((i+1)); done; }
"$W/bin/iptables-restore" <"$W/base"
printf 'vallum-iptables -A: '; ms calls "$W/bin/iptables"
if command -v iptables-legacy >/dev/null && command -v unshare >/dev/null; then
  printf 'iptables-legacy -A: '
  unshare --net sh -c "iptables-legacy-restore <'$W/base'; s=\$(date +%s%N); i=0; while [ \$i -lt $CALLS ]; do iptables-legacy -A INPUT -s 192.168.\$((i/256)).\$((i%256)) -j DROP; i=\$((i+1)); done; e=\$(date +%s%N); echo \$(( (e-s)/1000/$CALLS ))us/call"
fi
if command -v nft >/dev/null && command -v unshare >/dev/null; then
  printf 'nft add rule: '
  unshare --net sh -c "nft add table ip f; nft add chain ip f input '{ type filter hook input priority 0; }'; awk 'NR>1 && /^-A/ {print \"add rule ip f input ip saddr \" \$4 \" tcp dport 80 accept\"}' '$W/base' | nft -f -; s=\$(date +%s%N); i=0; while [ \$i -lt $CALLS ]; do nft add rule ip f input ip saddr 192.168.\$((i/256)).\$((i%256)) drop; i=\$((i+1)); done; e=\$(date +%s%N); echo \$(( (e-s)/1000/$CALLS ))us/call"
fi
