#!/usr/bin/env bash
# A one-node Slurm whose node offers its GPUs (gres/gpu), on a machine without a package manager at
# hand, as the lent GPU machines are: Debian bookworm's Slurm 22.05, carried in as .deb files,
# unpacked and copied over /usr without replacing anything the machine has; munged, slurmctld and
# slurmd started without systemd; one partition `gpu`. No accounting (slurmdbd): sacct answers
# nothing, and a job's end is known from its result file. The recipe: ../shared/slurm/gpu-node.md.
#   bash scripts/slurm_gpu_node.sh --fetch DIR   # on a Debian machine: the debs into DIR (~5 MB)
#   bash scripts/slurm_gpu_node.sh DIR           # on the GPU machine, as root: install and start (idempotent)
# Knobs: SLURM_CI_DIR (/tmp/slurm-gpu): state, logs, pid files; SLURM_GPU_SHARDS (0): N > 0 also
# offers each GPU as N shards (gres/shard, so that N single-rank tasks share one GPU).
set -euo pipefail
PKGS="slurmd slurmctld slurm-client slurm-wlm-basic-plugins libslurm38 munge libmunge2 libdbus-1-3 libjson-c5
  libyaml-0-2 libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15"
if [ "${1:-}" = --fetch ]; then
  mkdir -p "$2" && cd "$2" && apt-get download $PKGS && exit 0
fi
DEBS=$(cd "${1:?usage: slurm_gpu_node.sh DEBS_DIR (or --fetch DIR)}" && pwd)
BASE=${SLURM_CI_DIR:-/tmp/slurm-gpu}
SHARDS=${SLURM_GPU_SHARDS:-0}
NODE=$(hostname -s)
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm_conf.sh
source "$HERE/slurm_conf.sh"
t0=$(date +%s)
log() { echo "[slurm_gpu_node $(( $(date +%s) - t0 ))s] $*"; }

# ---- 1. the debs, unpacked: dpkg's dependencies name packages the machine has under other names
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
  tmp=$(mktemp -d)
  for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$tmp"; done
  cp -an "$tmp/usr/." /usr/  # -n: the machine's own files (its hwloc, its libraries) stay
  if [ -d "$tmp/lib" ]; then cp -an "$tmp/lib/." /usr/lib/; fi  # the machine's /lib is a link to /usr/lib
  if [ -d "$tmp/etc" ]; then cp -an "$tmp/etc/." /etc/; fi
  for daemon in slurmd slurmctld slurmstepd; do  # Debian names them slurmd-wlm, ...
    [ -e "/usr/sbin/$daemon" ] || ln -s "/usr/sbin/$daemon-wlm" "/usr/sbin/$daemon"
  done
  ldconfig
  rm -rf "$tmp"
fi
log "slurm $(slurmd -V | awk '{print $2}')"
mkdir -p "$BASE"/{ctld,spool/"$NODE",log} /etc/slurm /sys/fs/cgroup/system.slice  # slurmd 22.05 wants its cgroup scope

# ---- 2. the config: this node, its GPUs as gres
gpus=$(nvidia-smi -L | grep -c '^GPU')
gres="gpu:$gpus" types="gpu"
if [ "$SHARDS" -gt 0 ]; then gres+=",shard:$(( gpus * SHARDS ))" types+=",shard"; fi
{
  slurm_conf_common "$NODE" 127.0.0.1 "$BASE" "AccountingStorageType=accounting_storage/none"
  echo "GresTypes=$types"
  echo "NodeName=$NODE NodeAddr=127.0.0.1 $(slurm_node_hw) Gres=$gres State=UNKNOWN"
  echo "PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} > /etc/slurm/slurm.conf
{
  for i in $(seq 0 $(( gpus - 1 ))); do
    echo "Name=gpu File=/dev/nvidia$i"
    if [ "$SHARDS" -gt 0 ]; then echo "Name=shard Count=$SHARDS File=/dev/nvidia$i"; fi
  done
} > /etc/slurm/gres.conf
printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nConstrainDevices=no\n' > /etc/slurm/cgroup.conf

# ---- 3. munge, then the daemons
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  [ -s /etc/munge/munge.key ] || { head -c 1024 /dev/urandom > /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  munged --force
fi
for daemon in slurmctld slurmd; do
  pkill -x "$daemon" || true  # a new config: start again, once the old daemon is gone
  for _ in $(seq 50); do pgrep -x "$daemon" >/dev/null || break; sleep 0.2; done
  "/usr/sbin/$daemon"
done
for _ in $(seq 60); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in idle*|mixed*) break ;; down*|drain*) scontrol update nodename="$NODE" state=resume || true ;; esac
  sleep 0.5
done
case "$state" in idle*|mixed*) ;; *) echo "node $NODE not idle: '$state'" >&2; tail -20 "$BASE/log/slurmd.$NODE.log" >&2; exit 1 ;; esac
log "up: $gres on $NODE"
sinfo -o "%P %N %T %G"
