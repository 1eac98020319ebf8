#!/usr/bin/env bash
# By hand only, never in CI: a one-host Slurm cluster with the recipe of
# deploy/slurm/ (its gres.conf, the slurm.conf excerpt's lines, the
# TaskProlog, the scheduler on /run/tensile, its sockets open to every user
# by --socket-mode 0666)
# and jobs of an ordinary user that find their GPU's scheduler through it.
#
#   apt-get install slurmctld slurmd slurm-client munge     (Debian 12: Slurm 22.05)
#   deploy/slurm/try-single-host.sh [USER]                   (as root; USER default nobody)
#
# The machine needs no GPU: Slurm's GPUs are /dev/tty0 and /dev/tty1 (as
# Slurm's own tests fake them) and the scheduler serves two simulated GPUs
# (--gpus 0,1 --device a6000, 1500 MB each). Everything runs from a temporary folder with
# its own munge key and ports (16817, 16818); every daemon it starts is
# stopped at the end, by its process id. The binaries: BIN_DIR (default
# target/debug). deploy/README.md has the output of one run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
bin=${BIN_DIR:-$root/target/debug}
user=${1:-nobody}
sockets=/run/tensile

die() {
  echo "try-single-host: $*" >&2
  exit 1
}
[[ $(id -u) == 0 ]] || die "run as root (it starts munged, slurmctld and slurmd)"
for c in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$c" >/dev/null || die "no $c: apt-get install slurmctld slurmd slurm-client munge"
done
for b in tensile-scheduler tensile-worker tensilectl; do
  [[ -x $bin/$b ]] || die "no $bin/$b: cargo build -p tensile-scheduler -p tensile-worker -p tensilectl (or set BIN_DIR)"
done
[[ $(id -u "$user") != 0 ]] || die "the jobs' user must not be root"
[[ ! -e $sockets ]] || die "$sockets exists: is a scheduler already running? (remove it first)"

work=$(mktemp -d /tmp/tensile-slurm-XXXXXX)
chmod 0755 "$work"
pids=()
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$sockets"
}
trap stop_all EXIT
show() {
  printf '\n$ %s\n' "$*"
  "$@"
}
as_user() { runuser -u "$user" -- env SLURM_CONF="$work/etc/slurm.conf" "$@"; }

echo "== munge (own key and socket) and Slurm $(slurmd -V | cut -d' ' -f2) in $work"
mkdir -p "$work/munge" "$work/munge-key" "$work/etc" "$work/state" "$work/spool" "$work/log" "$work/out"
dd if=/dev/urandom of="$work/munge-key/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$work/munge" "$work/munge-key"
chmod 0700 "$work/munge-key"
chmod 0400 "$work/munge-key/munge.key"
setpriv --reuid=munge --regid=munge --init-groups munged --foreground --key-file="$work/munge-key/munge.key" \
  --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munged.seed" >"$work/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S $work/munge/munge.socket ]] && break; sleep 0.1; done
[[ -S $work/munge/munge.socket ]] || die "munged did not start: $work/munge/munged.log"

host=$(hostname -s)
{
  cat <<EOF
ClusterName=tensiletry
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
DefMemPerCPU=100
EOF
  # deploy/slurm/slurm.conf.excerpt's settings, the TaskProlog where this checkout has it.
  grep -E '^(GresTypes|SelectType|SelectTypeParameters)=' deploy/slurm/slurm.conf.excerpt
  echo "TaskProlog=$root/deploy/slurm/tensile-taskprolog"
  gres=$(sed -n 's/^NodeName=.*\(Gres=[^ ]*\).*/\1/p' deploy/slurm/slurm.conf.excerpt)
  echo "NodeName=$host CPUs=$(nproc) RealMemory=1000 $gres State=UNKNOWN"
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP"
} >"$work/etc/slurm.conf"
# deploy/slurm/gres.conf with the fake GPUs.
sed 's|/dev/nvidia|/dev/tty|g' deploy/slurm/gres.conf >"$work/etc/gres.conf"
export SLURM_CONF=$work/etc/slurm.conf
show grep -E '^(GresTypes|SelectType|TaskProlog|NodeName)' "$work/etc/slurm.conf"
show grep -v '^#' "$work/etc/gres.conf"

echo
echo "== the node's scheduler, as tensile-scheduler.service starts it (systemd makes $sockets 0755)"
mkdir -m 0755 "$sockets"
"$bin/tensile-scheduler" --gpus 0,1 --socket-dir "$sockets" --device a6000 --budget-mb 1500 --state none \
  --socket-mode 0666 >"$work/log/tensile-scheduler.log" 2>&1 &
pids+=($!)
# Up once gpus.json is there (written when every socket listens), as the
# unit's ExecStartPost waits.
for _ in $(seq 300); do [[ -f $sockets/gpus.json ]] && break; sleep 0.2; done
[[ -f $sockets/gpus.json ]] || die "the scheduler wrote no $sockets/gpus.json: $work/log/tensile-scheduler.log"
show ls -l "$sockets"

echo
echo "== slurmctld and slurmd"
slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
pids+=($!)
sleep 2
slurmd -D -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break; sleep 0.2; done
show sinfo -o '%P %a %D %T %N %G'

echo
echo "== jobs of user $user"
# shellcheck disable=SC2016 # expanded by the jobs, not here
report='echo "task $SLURM_PROCID: SLURM_STEP_GPUS=$SLURM_STEP_GPUS SLURM_SHARDS_ON_NODE=${SLURM_SHARDS_ON_NODE:-} TENSILE_SERVER=$TENSILE_SERVER TENSILE_BUDGET_MB=$TENSILE_BUDGET_MB"'
show as_user srun --gres=shard:16 sh -c "$report"
show as_user srun --gres=gpu:1 sh -c "$report"
show as_user srun -n2 --gres=gpu:2 sh -c "$report"
show as_user srun -n2 --gres=shard:8 sh -c "$report"

echo
echo "== two training jobs of 16 shards each at once, each a tensile-worker on its GPU's scheduler"
cat >"$work/out/train.sh" <<EOF
#!/bin/sh
$report
$bin/tensile-worker --scheduler "\$TENSILE_SERVER" --memory-mb "\$TENSILE_BUDGET_MB" --name "slurm-job-\$SLURM_JOB_ID" \\
  --model resnet50 --batch 2 --resolution 32 --iterations 40 --json >"$work/out/worker-\$SLURM_JOB_ID.jsonl" 2>"$work/out/worker-\$SLURM_JOB_ID.log" &
sleep 8
$bin/tensilectl status
wait \$!
echo "worker exit status \$?, \$(wc -l <"$work/out/worker-\$SLURM_JOB_ID.jsonl") iterations reported"
EOF
chmod 0755 "$work/out/train.sh"
chmod 0777 "$work/out"
job1=$(as_user sbatch --parsable --gres=shard:16 -o "$work/out/slurm-%j.out" "$work/out/train.sh")
job2=$(as_user sbatch --parsable --gres=shard:16 -o "$work/out/slurm-%j.out" "$work/out/train.sh")
for _ in $(seq 600); do [[ -z $(squeue -h -j "$job1,$job2" 2>/dev/null) ]] && break; sleep 0.5; done
for j in "$job1" "$job2"; do show cat "$work/out/slurm-$j.out"; done

echo
echo "== done: stopping slurmd, slurmctld, the scheduler and munged"
