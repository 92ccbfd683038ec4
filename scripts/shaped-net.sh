#!/usr/bin/env bash
# A shaped multi-host network on one machine, for tests and experiments (needs root).
#
#   scripts/shaped-net.sh up <prefix> <hosts> <rate> [burst]   # e.g. up sap 2 1gbit
#   scripts/shaped-net.sh exec <prefix> <host> <command> [args...]
#   scripts/shaped-net.sh down <prefix>
#
# `up` makes network namespace <prefix>-sw holding a bridge, and per host i in [0, hosts) a
# namespace <prefix>-h<i> whose eth0 (address 10.77.0.<i+1>/24) is joined to the bridge by a veth
# pair, with a tbf rate limit on both ends of the link (the netem qdisc is not available on these
# machines; tbf is): each host's link carries <rate> each way. `exec` runs a command on host i: in
# its network namespace, and in mount and UTS namespaces of its own where the host has its own
# hostname (h<i>) and boot id, so that UCX (which tells machines apart by boot id) and sapipe
# (hostname) see different machines and only ranks on one host share memory. `down` removes
# every namespace of the prefix (what a host ran dies with it); it is safe to run twice.
set -euo pipefail

cmd=${1:?usage: shaped-net.sh up|exec|down <prefix> ...}
prefix=${2:?a prefix for the namespace names}

case "$cmd" in
  up)
    hosts=${3:?the number of hosts}
    rate=${4:?a tbf rate, e.g. 1gbit}
    burst=${5:-256kb}
    sw="$prefix-sw"
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    ip -n "$sw" link set lo up
    for ((i = 0; i < hosts; i++)); do
      ns="$prefix-h$i"
      ip netns add "$ns"
      # Both ends are created in the switch namespace (short names), then one moves to the host.
      ip -n "$sw" link add "p$i" type veth peer name "e$i"
      ip -n "$sw" link set "e$i" netns "$ns"
      ip -n "$ns" link set "e$i" name eth0
      ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      ip -n "$sw" link set "p$i" master br0
      ip -n "$sw" link set "p$i" up
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
      ip netns exec "$sw" tc qdisc add dev "p$i" root tbf rate "$rate" burst "$burst" latency 100ms
      mkdir -p "/run/$prefix"
      cat /proc/sys/kernel/random/uuid > "/run/$prefix/boot_id-h$i"
    done
    ;;
  exec)
    host=${3:?the host index}
    shift 3
    ns="$prefix-h$host"
    exec ip netns exec "$ns" unshare --mount --uts sh -c '
      mount --bind "$1" /proc/sys/kernel/random/boot_id
      hostname "$2"
      shift 2
      exec "$@"' sh "/run/$prefix/boot_id-h$host" "h$host" "$@"
    ;;
  down)
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-(sw|h[0-9]+)$" || true); do
      # Whatever still runs in the namespace goes first, so that its links can be removed.
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "/run/$prefix"
    ;;
  *)
    echo "shaped-net.sh: unknown command $cmd (up, exec, down)" >&2
    exit 2
    ;;
esac
