#!/usr/bin/env bash
# A one-host SLURM cluster (slurmctld + slurmd on this machine) for tests/test_wrap.py's srun
# test. Best effort: without root, apt or a working SLURM, it says why and exits 0 (the test
# then runs with SLURM's variables set by hand and says so).
set -uo pipefail
say() { echo "ci/slurm: $*"; }
if [ "$(id -u)" != 0 ]; then say "not root: no SLURM"; exit 0; fi
if ! command -v srun >/dev/null || ! command -v slurmctld >/dev/null; then
    if ! command -v apt-get >/dev/null; then say "no apt-get: no SLURM"; exit 0; fi
    (timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 \
        apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge) \
        >/tmp/ci-slurm-apt.log 2>&1 || { say "apt could not install SLURM (see /tmp/ci-slurm-apt.log)"; exit 0; }
fi
H=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=pardiagci
SlurmctldHost=$H
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$H CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge 2>/dev/null; chmod 400 /etc/munge/munge.key 2>/dev/null
pgrep -x munged >/dev/null || munged --force || { say "munged did not start"; exit 0; }
pgrep -x slurmctld >/dev/null || slurmctld || { say "slurmctld did not start"; exit 0; }
pgrep -x slurmd >/dev/null || slurmd || { say "slurmd did not start"; exit 0; }
for _ in $(seq 1 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then say "SLURM up on $H"; exit 0; fi
    sleep 1
done
say "SLURM did not come up (sinfo: $(sinfo 2>&1 | tail -1))"
exit 0
