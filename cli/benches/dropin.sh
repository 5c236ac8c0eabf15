#!/bin/sh
# Drop-in iptables, issue #22 item 4, same run (root; the kernel tools in a private netns):
#   1. 200 calls of `iptables -A` (separate processes) on a ruleset of N rules (default 10000):
#      vallum-iptables against vallumd, iptables-legacy, iptables-nft (if installed), nft;
#   2. 200 EditRuleset calls over one gRPC channel (the edit_channel bench binary, if built:
#      `cargo bench -p vallum-cli --bench edit_channel --no-run`);
#   3. 200 calls of `iptables-restore --noflush` replacing one chain of 10 rules (SVC, jumped
#      to from INPUT) in the same ruleset, against one `-A`;
#   4. with VIA=unix and python3: the `-A` request of 1. from one process, 200 times on a new
#      connection each and 200 times on one connection (cli/benches/local_conn.py): what a new
#      connection costs vallumd without the process per call.
# Usage: cli/benches/dropin.sh [TARGET_DIR] [N]   (TARGET_DIR default target/release)
# DB_DIR: where vallumd's database lives (default a temporary directory; /dev/shm shows
# what the commit costs without the disk's fsync). CORES: vallumd's --cores (default 1);
# VALLUMD_ARGS: more vallumd flags, e.g. "--source synthetic --worker-nice 10" for the runs
# with traffic (the workers decide synthetic packets flat out on every core).
# VIA: how the clients reach vallumd: `unix` (default: vallumd's --socket, the drop-in's own
# default endpoint) or `tcp` (loopback). KERNEL=0 skips the kernel tools (A/B runs of two
# builds, alternated). VALLUM_SYNC: the durability the edits ask for (default normal).
set -eu
T=${1:-target/release}; N=${2:-10000}; CALLS=200
W=$(mktemp -d); D=${DB_DIR:-$W}/vallum-dropin-$$
mkdir -p "$D"
trap 'kill $VPID 2>/dev/null; wait $VPID 2>/dev/null; rm -rf "$W" "$D"' EXIT
# shellcheck disable=SC2086 # VALLUMD_ARGS is a list of words
case ${VIA:-unix} in unix) SOCK=$W/v.sock ;; tcp) SOCK=none ;; *) echo "VIA=${VIA}: unix or tcp" >&2; exit 2 ;; esac
# --max-request-bytes, --max-rules: the base of N=100000 is ~8 MB of text and 100,011 rules, over
# the defaults (4 MiB, 100,000).
"$T/vallumd" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --max-request-bytes 67108864 --max-rules 1000000 --cores "${CORES:-1}" ${VALLUMD_ARGS:-} --insecure-no-auth --socket "$SOCK" --db "$D/v.db" >"$W/log" 2>&1 &
VPID=$!
while ! grep -q "listening on" "$W/log"; do sleep 0.1; done
if [ "$SOCK" = none ]; then
  export VALLUM_SERVER=http://$(grep -o "listening on [0-9.:]*" "$W/log" | awk '{print $3}')
else
  export VALLUM_SERVER=unix:$SOCK
fi
export VALLUM_METRICS=$(grep -o "metrics on [0-9.:]*" "$W/log" | awk '{print $3}')
export VALLUM_RULESET=bench
mkdir "$W/bin"; for n in iptables iptables-restore; do ln -s "$(realpath "$T/vallum-iptables")" "$W/bin/$n"; done
{ echo '*filter'; echo ':SVC - [0:0]'; echo '-A INPUT -j SVC'; i=0; while [ $i -lt $N ]; do echo "-A INPUT -s 10.$((i/65536%256)).$((i/256%256)).$((i%256)) -p tcp --dport 80 -j ACCEPT"; i=$((i+1)); done
  i=0; while [ $i -lt 10 ]; do echo "-A SVC -s 172.16.0.$i -p tcp --dport 443 -j ACCEPT"; i=$((i+1)); done; echo COMMIT; } >"$W/base"
ms() { s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e-s)/1000/CALLS ))us/call; }
calls() { i=0; while [ $i -lt $CALLS ]; do "$@" -A INPUT -s 192.168.$((i/256)).$((i%256)) -j DROP; i=$((i+1)); done; }
chain() { i=0; while [ $i -lt $CALLS ]; do { echo '*filter'; echo '-F SVC'; j=0; while [ $j -lt 10 ]; do echo "-A SVC -s 172.16.$((i%256)).$j -p tcp --dport 443 -j ACCEPT"; j=$((j+1)); done; echo COMMIT; } | "$@" --noflush; i=$((i+1)); done; }
"$W/bin/iptables-restore" -w 60 <"$W/base"
echo "base: $(grep -c '^-A' "$W/base") rules, db in ${DB_DIR:-$W (temporary directory)}, vallumd --cores ${CORES:-1} ${VALLUMD_ARGS:-}, via $VALLUM_SERVER, sync ${VALLUM_SYNC:-normal}, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'vallum-iptables -A: '; ms calls "$W/bin/iptables"
printf 'vallum-iptables-restore --noflush, one chain of 10 rules: '; ms chain "$W/bin/iptables-restore"
B=$(ls "$T"/deps/edit_channel-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
if [ -n "$B" ]; then "$B"; else echo 'EditRuleset over one channel: not built (cargo bench -p vallum-cli --bench edit_channel --no-run)'; fi
# What a new connection costs vallumd, without a process per call (needs python3; unix only).
if [ "$SOCK" != none ] && command -v python3 >/dev/null; then python3 "$(dirname "$0")/local_conn.py" "$SOCK" "$CALLS"; fi
[ "${KERNEL:-1}" = 0 ] && exit 0
if command -v iptables-legacy >/dev/null && command -v unshare >/dev/null; then
  printf 'iptables-legacy -A: '
  unshare --net sh -c "iptables-legacy-restore <'$W/base'; s=\$(date +%s%N); i=0; while [ \$i -lt $CALLS ]; do iptables-legacy -A INPUT -s 192.168.\$((i/256)).\$((i%256)) -j DROP; i=\$((i+1)); done; e=\$(date +%s%N); echo \$(( (e-s)/1000/$CALLS ))us/call"
fi
if command -v iptables-nft >/dev/null && command -v unshare >/dev/null; then
  printf 'iptables-nft -A: '
  unshare --net sh -c "iptables-nft-restore <'$W/base'; s=\$(date +%s%N); i=0; while [ \$i -lt $CALLS ]; do iptables-nft -A INPUT -s 192.168.\$((i/256)).\$((i%256)) -j DROP; i=\$((i+1)); done; e=\$(date +%s%N); echo \$(( (e-s)/1000/$CALLS ))us/call"
fi
if command -v nft >/dev/null && command -v unshare >/dev/null; then
  printf 'nft add rule: '
  unshare --net sh -c "nft add table ip f; nft add chain ip f input '{ type filter hook input priority 0; }'; awk '/^-A INPUT -s/ {print \"add rule ip f input ip saddr \" \$4 \" tcp dport 80 accept\"}' '$W/base' | nft -f -; s=\$(date +%s%N); i=0; while [ \$i -lt $CALLS ]; do nft add rule ip f input ip saddr 192.168.\$((i/256)).\$((i%256)) drop; i=\$((i+1)); done; e=\$(date +%s%N); echo \$(( (e-s)/1000/$CALLS ))us/call"
fi
