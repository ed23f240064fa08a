# Two nodes on one machine, sourced by .ci/two_nodes.sh, .ci/slurm_nodes.sh and
# benches/cluster_overhead.sh: network namespaces roll-a (10.77.0.2) and roll-b (10.77.0.3) on a
# bridge with the head (10.77.0.1); `sshd_up` runs an OpenSSH server in each, `slurm_up` a SLURM
# cluster (munge, slurmctld on the head, a slurmd per node under its own hostname, node1 and
# node2). Each node's daemons, and so the workers they start, have a /dev/shm of their own: the
# head's host areas there are not theirs to see, as on another machine (the rest of the
# filesystem is shared, as a cluster's home directories are). Needs root and iproute2 (+ openssh-server, + slurmd slurmctld slurm-client munge).
# `nodes_cleanup` (set as the EXIT trap) kills the head named in $head_pid, every worker and
# daemon, and removes the namespaces, the bridge and the scratch directory $W.
BIN="$PWD/${BIN:-target/debug/roll-tui}"
W=$(mktemp -d /tmp/roll-nodes.XXXXXX)
chmod 755 "$W"
NODES=(a b)
NODE_ADDRS=(10.77.0.2 10.77.0.3)
head_pid=""

nodes_cleanup() {
    # A run still going (a failed check), then anything it started, then the nodes.
    if [ -n "$head_pid" ]; then kill -9 "$head_pid" 2>/dev/null || true; fi
    pkill -9 -f -- "^$BIN worker .*--secret-stdin" 2>/dev/null || true
    local pids=()
    for pid in "$W"/*.pid "$W"/munge/*.pid; do
        if [ -f "$pid" ]; then pids+=("$(cat "$pid")"); fi
    done
    if [ ${#pids[@]} -gt 0 ]; then
        kill "${pids[@]}" 2>/dev/null || true
        # The daemons write their state as they stop: let them, before their directory goes.
        for _ in $(seq 50); do
            local alive=""
            for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            [ -n "$alive" ] || break
            sleep 0.1
        done
        kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    for n in "${NODES[@]}"; do ip netns del "roll-$n" 2>/dev/null || true; done
    ip link del roll-br 2>/dev/null || true
    for n in "${NODES[@]}"; do ip link del "roll-$n-h" 2>/dev/null || true; done
    rm -rf "$W"
}
fail() { echo "$(basename "$0"): FAILED: $*" >&2; exit 1; }

nodes_up() {
    ip link add roll-br type bridge
    ip addr add 10.77.0.1/24 dev roll-br
    ip link set roll-br up
    local i=0
    for n in "${NODES[@]}"; do
        ip netns add "roll-$n"
        ip link add "roll-$n-h" type veth peer name eth0 netns "roll-$n"
        ip link set "roll-$n-h" master roll-br up
        ip netns exec "roll-$n" ip addr add "${NODE_ADDRS[$i]}/24" dev eth0
        ip netns exec "roll-$n" ip link set eth0 up
        ip netns exec "roll-$n" ip link set lo up
        i=$((i + 1))
    done
}

# An sshd in each node, a key pair for the test; SSH_OPTS are ssh's options to reach them.
sshd_up() {
    ssh-keygen -q -t ed25519 -N '' -f "$W/hostkey"
    ssh-keygen -q -t ed25519 -N '' -f "$W/userkey"
    cp "$W/userkey.pub" "$W/authorized_keys"
    chmod 600 "$W/authorized_keys"
    mkdir -p /run/sshd
    local i=0
    for n in "${NODES[@]}"; do
        ip netns exec "roll-$n" unshare --mount sh -c 'mount -t tmpfs tmpfs /dev/shm && exec "$@"' \
            sshd /usr/sbin/sshd -o "ListenAddress=${NODE_ADDRS[$i]}" \
            -o "HostKey=$W/hostkey" -o "AuthorizedKeysFile=$W/authorized_keys" \
            -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no \
            -o StrictModes=no -o UsePAM=no -o "PidFile=$W/sshd-$n.pid"
        i=$((i + 1))
    done
    SSH_OPTS=(-i "$W/userkey" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5)
    for host in "${NODE_ADDRS[@]}"; do
        for _ in $(seq 50); do
            if ssh "${SSH_OPTS[@]}" "$host" true 2>/dev/null; then continue 2; fi
            sleep 0.2
        done
        fail "no ssh to $host"
    done
}

# munged, slurmctld on the head and a slurmd in each node (its own UTS namespace gives it the
# hostname SLURM knows it by); exports SLURM_CONF for the client commands; returns once both
# nodes are idle.
slurm_up() {
    mkdir -p "$W/munge" "$W/ctld" "$W/spool"
    head -c 1024 /dev/urandom > "$W/munge/munge.key"
    chmod 600 "$W/munge/munge.key"
    chown -R munge:munge "$W/munge"
    runuser -u munge -- /usr/sbin/munged --key-file="$W/munge/munge.key" \
        --socket="$W/munge/socket" --pid-file="$W/munge/munged.pid" \
        --log-file="$W/munge/munged.log" --seed-file="$W/munge/seed"
    cat > "$W/slurm.conf" <<EOF
ClusterName=roll
SlurmctldHost=$(hostname -s)(10.77.0.1)
AuthType=auth/munge
AuthInfo=socket=$W/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$W/ctld
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd-%n.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=node1 NodeAddr=${NODE_ADDRS[0]} CPUs=2 State=UNKNOWN
NodeName=node2 NodeAddr=${NODE_ADDRS[1]} CPUs=2 State=UNKNOWN
PartitionName=roll Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
    # With the process tracking above slurmd needs no cgroup controller of its own.
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' \
        > "$W/cgroup.conf"
    export SLURM_CONF="$W/slurm.conf"
    slurmctld -i
    local i=1
    for n in "${NODES[@]}"; do
        ip netns exec "roll-$n" unshare --uts --mount sh -c \
            "hostname node$i && mount -t tmpfs tmpfs /dev/shm && exec slurmd"
        i=$((i + 1))
    done
    for _ in $(seq 150); do
        [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && return 0
        sleep 0.2
    done
    fail "the SLURM nodes are not idle: $(sinfo 2>&1); $(tail -3 "$W"/slurm*.log)"
}

# The run both node scripts train: six RL steps of a tiny model with every model role in a
# worker process (a reference too, for KL), on stdout.
net_config() {
    cat <<YAML
name: net
seed: 8
model: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 4, kv_heads: 2, intermediate: 64, chars: "0123456789+=abc>" } }
data: { domains: [ { name: add, synthetic: { task: addition, count: 64 }, reward: exact_match } ] }
rl:
  steps: 6
  prompts_per_step: 4
  group_size: 4
  kl: { mode: in_loss, coef: 0.05 }
  sampling: { temperature: 1.0, max_new_tokens: 8 }
  optimizer: { lr: 0.001 }
workers:
  actor_train: { mode: process }
  reference: { mode: process }
  actor_infer: { mode: process }
YAML
}
