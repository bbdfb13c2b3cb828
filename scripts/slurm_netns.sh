# Sourced by slurm_up.sh / slurm_down.sh: Slurm nodes node1..nodeN on this one machine, each slurmd
# in its own network namespace (own address on a private bridge) and UTS namespace (hostname =
# its NodeName, which is how a slurmd finds its own node: Debian's slurmd is built without
# --enable-multiple-slurmd, so `slurmd -N name` is refused). Nothing here reaches outside the
# machine: the bridge has no uplink and only this project's addresses.
NETNS_BRIDGE=sslurm0
NETNS_NET=${SLURM_CI_NET:-10.213.0}  # /24: the host (controller) is .1, node k is .(10+k)
NETNS_HOST=$NETNS_NET.1

netns_addr() { echo "$NETNS_NET.$(( 10 + $1 ))"; }

netns_up() { # netns_up N: the bridge and N namespaces, each with lo and one veth on the bridge
  local n=$1 k ns
  if ! ip link show "$NETNS_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NETNS_BRIDGE" type bridge
    ip addr add "$NETNS_HOST/24" dev "$NETNS_BRIDGE"
  fi
  ip link set "$NETNS_BRIDGE" up
  for k in $(seq "$n"); do
    ns=ss-node$k
    ip netns list | grep -qw "$ns" && continue
    ip netns add "$ns"
    ip link add "ss-h$k" type veth peer name "ss-n$k"
    ip link set "ss-h$k" master "$NETNS_BRIDGE" up
    ip link set "ss-n$k" netns "$ns"
    ip -n "$ns" addr add "$(netns_addr "$k")/24" dev "ss-n$k"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "ss-n$k" up
    ip -n "$ns" route add default via "$NETNS_HOST"  # srun and the controller answer from the host's side
  done
  # Node names resolve as on a cluster's DNS (an MPI's own launcher, MPICH's Hydra, connects by name).
  sed -i '/# sweepscale-netns$/d' /etc/hosts
  for k in $(seq "$n"); do echo "$(netns_addr "$k") node$k # sweepscale-netns" >> /etc/hosts; done
}

netns_slurmd() { # netns_slurmd K: start node K's slurmd in its namespaces (it daemonizes there)
  # nsenter, not `ip netns exec`: that remounts /sys, hiding /sys/fs/cgroup, which slurmd needs
  nsenter --net="/run/netns/ss-node$1" unshare --uts sh -c "hostname node$1 && exec /usr/sbin/slurmd"
}

netns_down() { # every namespace node's network, its names, and the bridge
  local ns
  sed -i '/# sweepscale-netns$/d' /etc/hosts 2>/dev/null || true
  for ns in $(ip netns list | awk '/^ss-node[0-9]+/ {print $1}'); do ip netns del "$ns"; done
  ip link del "$NETNS_BRIDGE" 2>/dev/null || true
}
