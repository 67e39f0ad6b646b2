#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine for the `slurm` tests (tests/test_slurm*.py).
#
# Installs Debian's slurmctld, slurmd and munge, writes /etc/slurm/slurm.conf with the node line
# that `slurmd -C` reports, starts munged, slurmctld and slurmd directly (no systemd: CI runs in
# containers) and waits until `sinfo` shows the node idle. Idempotent: a second run finds the
# cluster answering and returns at once. Must run as root.
#
#   .ci/slurm_up.sh            # then: pytest -m slurm
set -euo pipefail

SLURM_CONF=/etc/slurm/slurm.conf
LOG_DIR=/var/log/slurm
WAIT_S=${SLURM_UP_WAIT_S:-90}

log() { echo "[slurm_up] $*"; }

node_state() { sinfo -h -N -o '%t' 2>/dev/null | head -n1; }

if command -v sinfo >/dev/null && [[ "$(node_state)" == idle* || "$(node_state)" == mix* || "$(node_state)" == alloc* ]]; then
  log "cluster already up: $(sinfo -h -N -o '%N %t %c CPUs %m MB')"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "[slurm_up] must run as root (installs packages, starts daemons)" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  log "installing slurmctld slurmd munge slurm-client"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d 101: the packages' postinst must not try to start services (no init system here).
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends slurmctld slurmd munge slurm-client >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

# --- munge: one key shared by the (single) node and the controller -------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating the munge key"
  if command -v mungekey >/dev/null; then mungekey --create --force; else
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 20); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
fi
munge -n </dev/null | unmunge >/dev/null || { echo "[slurm_up] munged does not answer" >&2; exit 1; }

# --- slurm.conf: this host as controller and the only compute node --------------------------
host=$(hostname -s)
node_line=$(slurmd -C | head -n1)   # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
[[ "$node_line" == NodeName=* ]] || { echo "[slurm_up] unexpected 'slurmd -C' output: $node_line" >&2; exit 1; }
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR"
conf=$(cat <<CONF
# Written by .ci/slurm_up.sh: a one-node test cluster (controller + compute on $host).
ClusterName=cpbench-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# No cgroups in a container: track processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
# CPUs are the consumable resource; memory is not, so jobs without --mem share the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# No slurmdbd: job states come from scontrol (cpbench's launcher falls back to it from sacct).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Requeue allowed (submitit requeues on timeout/preemption); a short kill wait keeps tests fast;
# finished jobs stay visible to 'scontrol show job' for 10 minutes.
JobRequeue=1
KillWait=5
# A requeued job waits out the job credential's lifetime before it may start again (120 s by
# default, slurm.conf(5) AuthInfo cred_expire); 30 s still covers a batch step's launch here.
AuthInfo=cred_expire=30
MinJobAge=600
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
)
if [[ ! -f $SLURM_CONF ]] || [[ "$(cat $SLURM_CONF)" != "$conf" ]]; then
  log "writing $SLURM_CONF ($node_line)"
  printf '%s\n' "$conf" > "$SLURM_CONF"
  conf_changed=1
else
  conf_changed=0
fi

# --- daemons: started directly; a running one is reconfigured when the conf changed ---------
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
if alive /run/slurmctld.pid; then
  [[ $conf_changed == 1 ]] && { log "reconfiguring slurmctld"; scontrol reconfigure || true; }
else
  log "starting slurmctld"
  slurmctld
fi
if ! alive /run/slurmd.pid; then
  log "starting slurmd"
  slurmd
fi

# --- wait for the node ------------------------------------------------------------------------
deadline=$((SECONDS + WAIT_S))
while (( SECONDS < deadline )); do
  state=$(node_state || true)
  case "$state" in
    idle*|mix*|alloc*) log "cluster up: $(sinfo -h -N -o '%N %t %c CPUs %m MB')"; exit 0 ;;
    down*|drain*|fail*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
  esac
  sleep 1
done
echo "[slurm_up] node not idle after ${WAIT_S}s (state: ${state:-none}); see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log" >&2
tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 || true
exit 1
