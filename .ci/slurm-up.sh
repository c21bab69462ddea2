#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on localhost for tests/slurm (Debian 12, run as root, no
# systemd). Idempotent: does nothing when the node already answers `sinfo` as idle/mixed.
# Recipe: Debian's slurmctld + slurmd + munge, no slurmdbd
# (the tests run the plugin with `--slurm-status-command squeue`, which needs no accounting).
#
# The node *claims* the resources the SLURM profile asks for on a real cluster (64 CPUs,
# 512 GB, 8 GPUs backed by /dev/null) with SlurmdParameters=config_overrides, so that the
# profile's per-rule requests are schedulable on a small CI machine. Nothing is enforced
# (proctrack/linuxproc, task/none, no cgroups): jobs share the machine's real cores.
#
# Usage: .ci/slurm-up.sh        Stop with .ci/slurm-down.sh.
# Env:   SLURM_CI_CPUS (64), SLURM_CI_MEM_MB (512000), SLURM_CI_GPUS (8).
set -euo pipefail

CPUS=${SLURM_CI_CPUS:-64}
MEM=${SLURM_CI_MEM_MB:-512000}
GPUS=${SLURM_CI_GPUS:-8}
HOST=$(hostname -s)

node_up() { sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)$'; }

if command -v sinfo >/dev/null 2>&1 && node_up; then
  echo "slurm-up: SLURM already running on $HOST"; exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "slurm-up: must run as root to install and start SLURM" >&2; exit 1
fi
if ! getent hosts "$HOST" >/dev/null; then
  echo "slurm-up: host name $HOST does not resolve (add it to /etc/hosts)" >&2; exit 1
fi

PKGS="slurmctld slurmd slurm-client munge"
if ! dpkg-query -W -f='${Status}\n' $PKGS 2>/dev/null | grep -qv 'install ok installed' \
   && [ "$(dpkg-query -W -f='${Status}\n' $PKGS 2>/dev/null | wc -l)" = 4 ]; then
  echo "slurm-up: $PKGS already installed"
else
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi

# munge (Debian's postinst creates /etc/munge/munge.key)
[ -s /etc/munge/munge.key ] || { mungekey --create; chown munge:munge /etc/munge/munge.key; }
install -d -o munge -g munge -m 0755 /run/munge
if ! { [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null

install -d /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /etc/slurm
cat > /etc/slurm/slurm.conf <<CONF
# Written by .ci/slurm-up.sh (single-node CI cluster).
ClusterName=ci
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
MinJobAge=300
GresTypes=gpu
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
# Fake GPUs: one placeholder file each (slurmd wants a File per device, or Count must be 1).
install -d /run/slurm-ci
for i in $(seq 0 $((GPUS - 1))); do : > "/run/slurm-ci/gpu$i"; done
echo "NodeName=$HOST Name=gpu Count=$GPUS File=/run/slurm-ci/gpu[0-$((GPUS - 1))]" > /etc/slurm/gres.conf

for d in slurmctld slurmd; do
  pidfile=/run/$d.pid
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    scontrol reconfigure >/dev/null 2>&1 || true
  else
    "$d" || { echo "slurm-up: $d failed to start; see /var/log/slurm/$d.log" >&2; tail -5 "/var/log/slurm/$d.log" >&2; exit 1; }
  fi
done
for _ in $(seq 1 120); do node_up && break; sleep 0.25; done
if ! node_up; then
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  for _ in $(seq 1 40); do node_up && break; sleep 0.25; done
fi
sinfo
node_up || { echo "slurm-up: node $HOST did not become idle; see /var/log/slurm/" >&2; exit 1; }
srun -t 1 hostname >/dev/null
echo "slurm-up: SLURM is up on $HOST ($CPUS CPUs, $MEM MB, $GPUS GPUs claimed)"
