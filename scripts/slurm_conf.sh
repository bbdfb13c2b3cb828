# Sourced by slurm_up.sh (CI's Slurm) and slurm_gpu_node.sh (a lent GPU machine's): the lines of
# slurm.conf both write, no systemd and no cgroups to track processes (proctrack/linuxproc).
# The scheduler's passes every 2 s, not Slurm's 60 (main) and 30 (backfill): a job held until a
# time (BeginTime, a requeue's wait) starts within seconds of it; on a node of a few jobs, cheap.
#   slurm_conf_common NODE CTLD_ADDR BASE ACCOUNTING_LINES
slurm_conf_common() {
  cat <<EOF2
ClusterName=ci
SlurmctldHost=$1($2)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$4
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=2
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$3/slurmctld.pid
SlurmdPidFile=$3/slurmd.%n.pid
StateSaveLocation=$3/ctld
SlurmdSpoolDir=$3/spool/%n
SlurmctldLogFile=$3/log/slurmctld.log
SlurmdLogFile=$3/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
MinJobAge=300
KillWait=5
TreeWidth=64
InactiveLimit=0
Waittime=0
EOF2
}

# The hardware line slurmd reports (CPUs, sockets, cores, threads), so that slurmd agrees with it,
# and 90% of its memory.
slurm_node_hw() {
  local hw mem
  hw=$(slurmd -C 2>/dev/null | head -1 | sed -E 's/^NodeName=[^ ]+ //; s/RealMemory=[0-9]+//')
  mem=$(slurmd -C 2>/dev/null | head -1 | sed -E 's/.*RealMemory=([0-9]+).*/\1/')
  echo "$hw RealMemory=$(( mem * 9 / 10 ))"
}
