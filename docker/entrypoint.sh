#!/bin/sh
# Entrypoint of the pscluster node image (docker/Dockerfile), run under tini.
#
#   sshd                 (default) a node: host key, authorized keys, then sshd in the foreground.
#                        Needs root; only the `pscluster` user can log in (docker/sshd_config).
#   lab-train JOB [ARG]  the control container of docker/compose.yaml: `pscluster up` on
#                        $PSCLUSTER_INVENTORY, `pscluster train JOB ARG...`, then `pscluster down`
#                        whatever train did; exits with train's status (or down's, if train passed).
#   idle                 a node reached with `docker exec` (ansible_connection: docker): no sshd,
#                        PID 1 (tini) waits and reaps what pscluster starts in the container.
#   anything else        run as given; started as root, it runs as `pscluster` instead.
#
# Node settings (environment):
#   PSCLUSTER_AUTHORIZED_KEYS       public key line(s) allowed to log in, and/or
#   /run/pscluster/authorized_keys  a file of them (mount it read-only).
#   PSCLUSTER_KNOWN_HOSTS_NAME      the address clients use for this node; with it, the node
#                                   publishes "NAME ssh-ed25519 KEY" to
#                                   /var/lib/pscluster/ssh/known_hosts (a volume the control
#                                   mounts read-only), so clients learn the key without trusting
#                                   the network on first contact.
set -eu

HOSTKEY=/etc/ssh/hostkeys/ssh_host_ed25519_key
KEYS_FILE=/run/pscluster/authorized_keys
KNOWN_HOSTS_DIR=/var/lib/pscluster/ssh
USER_NAME=pscluster
UID_NOW=$(id -u)

die() {
    printf 'pscluster-entrypoint: %s\n' "$*" >&2
    exit 2
}

install_authorized_keys() {
    keys=$(mktemp)
    if [ -n "${PSCLUSTER_AUTHORIZED_KEYS:-}" ]; then
        printf '%s\n' "$PSCLUSTER_AUTHORIZED_KEYS" >>"$keys"
    fi
    if [ -f "$KEYS_FILE" ]; then
        cat "$KEYS_FILE" >>"$keys"
    fi
    if ! ssh-keygen -l -f "$keys" >/dev/null 2>&1; then
        rm -f "$keys"
        die "no public key to admit: mount one at $KEYS_FILE or set PSCLUSTER_AUTHORIZED_KEYS"
    fi
    # Root-owned and read-only for the user: sshd's StrictModes accepts it, the user cannot edit it.
    install -m 0644 -o root -g root "$keys" "/etc/ssh/authorized_keys/$USER_NAME"
    rm -f "$keys"
}

publish_host_key() {
    name=$1
    entry="$name $(cut -d ' ' -f 1,2 "$HOSTKEY.pub")"
    file="$KNOWN_HOSTS_DIR/known_hosts"
    # Nodes start together and share the file: replace this node's line under a lock, then
    # rename into place so a reader never sees half a file.
    (
        flock 9
        tmp=$(mktemp "$file.XXXXXX")
        if [ -f "$file" ]; then
            awk -v name="$name" '$1 != name' "$file" >"$tmp"
        fi
        printf '%s\n' "$entry" >>"$tmp"
        chmod 0644 "$tmp"
        mv -f "$tmp" "$file"
    ) 9>"$KNOWN_HOSTS_DIR/.lock"
}

start_sshd() {
    [ "$UID_NOW" -eq 0 ] || die "sshd must start as root (it switches to $USER_NAME per login)"
    if [ ! -s "$HOSTKEY" ]; then
        node=$(hostname)
        ssh-keygen -q -t ed25519 -N '' -C "$USER_NAME-node@$node" -f "$HOSTKEY"
    elif [ ! -s "$HOSTKEY.pub" ]; then
        ssh-keygen -y -f "$HOSTKEY" >"$HOSTKEY.pub"
    fi
    install_authorized_keys
    if [ -n "${PSCLUSTER_KNOWN_HOSTS_NAME:-}" ]; then
        [ -d "$KNOWN_HOSTS_DIR" ] || die "PSCLUSTER_KNOWN_HOSTS_NAME is set but $KNOWN_HOSTS_DIR is missing"
        publish_host_key "$PSCLUSTER_KNOWN_HOSTS_NAME"
    fi
    mkdir -p /run/sshd
    ssh-keygen -l -f "$HOSTKEY.pub" >&2
    exec /usr/sbin/sshd -D -e
}

lab_train() {
    [ "$#" -ge 1 ] || die "usage: lab-train JOB [pscluster train options]"
    inventory=${PSCLUSTER_INVENTORY:-inventories/docker.yaml}
    # `up` stops whatever it started when it fails, so there is nothing to bring down then.
    pscluster up "$inventory"
    status=0
    pscluster train "$@" || status=$?
    if ! pscluster down; then
        [ "$status" -ne 0 ] || status=1
    fi
    exit "$status"
}

if [ "$#" -eq 0 ]; then
    set -- sshd
fi

case "$1" in
sshd)
    start_sshd
    ;;
idle)
    # Stays root: `docker exec --user pscluster` (ansible_user) chooses who runs the tasks.
    [ "$UID_NOW" -eq 0 ] && touch /run/pscluster-idle    # the image's HEALTHCHECK: healthy without sshd
    exec sleep infinity
    ;;
*)
    if [ "$UID_NOW" -eq 0 ]; then
        # Never run pscluster or TensorFlow as root by accident.
        export HOME="/home/$USER_NAME" USER="$USER_NAME" LOGNAME="$USER_NAME"
        exec setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --init-groups -- "$0" "$@"
    fi
    if [ "$1" = lab-train ]; then
        shift
        lab_train "$@"
    fi
    exec "$@"
    ;;
esac
