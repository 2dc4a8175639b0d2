#!/usr/bin/env bash
# tests/stats/launch.sh — a stand-in for one node of a torchrun or srun launch, for tests.
# It sets the variables the real launchers set for each process and starts NPROC of them:
#   torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,
#             TORCHELASTIC_RUN_ID, MASTER_ADDR, MASTER_PORT
#   srun:     SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NNODES, SLURM_NODEID,
#             SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME
# With --host NAME the node runs in its own UTS namespace whose hostname is NAME (what
# gethostname() returns, so dumps carry NAME as their host, as on a real second node).
#
# usage: launch.sh torchrun|srun --host NAME --node-rank N --nnodes N --nproc N --job ID -- CMD [ARGS...]
# exit: 0 when every process exited 0, else 1 (as torchrun does); 77 when no UTS
# namespace can be made here.
set -u
style=$1; shift
host= node=0 nnodes=1 nproc=1 job=
while [ $# -gt 0 ]; do
    case $1 in
    --host) host=$2; shift 2 ;;
    --node-rank) node=$2; shift 2 ;;
    --nnodes) nnodes=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ -n "$host" ] && [ "${OG_LAUNCH_IN_NS:-}" != "$host" ]; then
    # Root may make a UTS namespace directly; others through a user namespace.
    self=$(readlink -f "$0")
    for u in "unshare --uts" "unshare --user --map-root-user --uts"; do
        if $u true 2>/dev/null; then
            exec env OG_LAUNCH_IN_NS="$host" $u bash -c 'hostname "$1" && shift && exec bash "$@"' \
                _ "$host" "$self" "$style" --host "$host" --node-rank "$node" --nnodes "$nnodes" \
                --nproc "$nproc" --job "$job" -- "$@"
        fi
    done
    echo "launch.sh: cannot make a UTS namespace (unshare --uts) to simulate host $host" >&2
    exit 77
fi
world=$((nnodes * nproc))
pids=()
for ((l = 0; l < nproc; l++)); do
    r=$((node * nproc + l))
    case $style in
    torchrun)
        env RANK=$r LOCAL_RANK=$l WORLD_SIZE=$world LOCAL_WORLD_SIZE=$nproc GROUP_RANK=$node NODE_RANK=$node \
            TORCHELASTIC_RUN_ID="$job" MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "$@" &
        ;;
    srun)
        env SLURM_PROCID=$r SLURM_LOCALID=$l SLURM_NTASKS=$world SLURM_NNODES=$nnodes SLURM_NODEID=$node \
            SLURM_JOB_ID="$job" SLURM_STEP_ID=0 SLURMD_NODENAME="$(hostname)" "$@" &
        ;;
    *) echo "launch.sh: style must be torchrun or srun" >&2; exit 2 ;;
    esac
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
