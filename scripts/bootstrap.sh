#!/usr/bin/env bash
# Sets up what pscluster needs on this machine, idempotently. One argument, the profile:
#   demo  what scripts/demo.sh needs to train on inventories/local.yaml (ansible_connection: local,
#         no SSH, no Slurm, no containers): a virtualenv in .venv with pscluster (editable) and
#         TensorFlow (CPU); nothing from apt.
#   test  (the default) what scripts/test.sh needs for the whole suite: the demo's .venv plus the
#         test tools, TensorBoard and legacy Keras, and the Debian packages of the lab tests
#         (openssh-server/client, sudo, iproute2, nftables; slurmctld/slurmd/slurm-client/munge
#         for the Slurm lab; docker.io/docker-compose/debootstrap/iptables for the container tests).
# Re-running is cheap: pip runs again only when setup.cfg changed or the profile asks for more.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-test}
case "$profile" in
  demo) extras=cpu ;;
  test) extras=cpu,test,tensorboard ;;
  *) echo "bootstrap: unknown profile '$profile' (use: demo or test)" >&2; exit 2 ;;
esac

if [ "$profile" = test ]; then
  apt_missing=()
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || apt_missing+=(openssh-server)
  command -v ssh >/dev/null 2>&1 || apt_missing+=(openssh-client)
  command -v sudo >/dev/null 2>&1 || apt_missing+=(sudo)    # ansible_become: tasks run through sudo -n -H -u USER
  command -v ip >/dev/null 2>&1 || apt_missing+=(iproute2)
  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || apt_missing+=(nftables)
  # The Slurm lab (tests/slurm, testbed/slurmlab.py): a real slurmctld/slurmd/munged, started by the test fixture itself.
  command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || apt_missing+=(slurmctld)
  command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || apt_missing+=(slurmd)
  command -v srun >/dev/null 2>&1 || apt_missing+=(slurm-client)
  command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || apt_missing+=(munge)
  # The container tests (tests/docker, testbed/dockerlab.py): Debian's Docker engine and client,
  # compose v1, debootstrap for the registry-free base image, iptables for dockerd's NAT.
  # Without their recommends (apparmor, git, needrestart...), as docs/platform-notes.md D1 measured.
  docker_missing=()
  [ -x /usr/bin/docker ] && [ -x /usr/sbin/dockerd ] || docker_missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || docker_missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || docker_missing+=(debootstrap)
  command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || docker_missing+=(iptables)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "bootstrap: installing Debian packages: ${apt_missing[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
    else
      echo "bootstrap: missing ${apt_missing[*]}; install them (apt-get install ${apt_missing[*]}) or run as root" >&2
      echo "bootstrap: continuing; the SSH lab tests will be skipped without them" >&2
    fi
  fi
  if [ ${#docker_missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "bootstrap: installing Debian packages: ${docker_missing[*]}"
      [ ${#apt_missing[@]} -gt 0 ] || DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${docker_missing[@]}" >/dev/null
    else
      echo "bootstrap: missing ${docker_missing[*]}; the container tests (tests/docker) will be skipped without them" >&2
    fi
  fi
fi

PY=${PSCLUSTER_BOOTSTRAP_PYTHON:-python3}
# The stamp holds the hash of the packaging files and the profile installed with them; a test
# set-up covers the demo's, not the other way round.
stamp=.venv/.pscluster-setup-stamp
want=$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)
# A venv this machine built before for the same packaging files, this script, the profile and
# the interpreter (a clean clone's, CI's): hard links to it (the same filesystem; 2-3 s) instead
# of pip's install (81 s on a fresh clone here, twenty-first session). Its scripts' paths are
# rewritten (into new files: a hard-linked file is never written in place) and pscluster itself
# is installed editable from this checkout again. PSCLUSTER_BOOTSTRAP_CACHE=0 turns it off; a
# cache that cannot be linked (another filesystem) is passed over.
cache_root=${PSCLUSTER_BOOTSTRAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pscluster/venvs}
[ "$cache_root" != 0 ] || cache_root=
cached=
if [ -n "$cache_root" ]; then
  key=$({ cat setup.cfg pyproject.toml scripts/bootstrap.sh; echo "$profile"
          "$PY" -c 'import sys; print(sys.version, sys.executable)'; } 2>/dev/null | sha256sum | cut -c1-20) || key=
  [ -z "$key" ] || cached=$cache_root/$key      # no interpreter to ask: no cache (the install below says why)
fi
if [ ! -e .venv ] && [ -n "$cached" ] && [ -f "$cached/.pscluster-cache-origin" ]; then
  if cp -al "$cached" .venv 2>/dev/null; then
    origin=$(cat "$cached/.pscluster-cache-origin")
    here=$PWD/.venv
    # Literal paths in sed: a checkout path may hold | & . * [ and the like.
    pattern=$(printf '%s' "$origin" | sed 's/[][\\.*^$|]/\\&/g')
    replacement=$(printf '%s' "$here" | sed 's/[\\&|]/\\&/g')
    for file in .venv/bin/* .venv/pyvenv.cfg; do
      if [ -f "$file" ] && [ ! -L "$file" ] && grep -qIF "$origin" "$file"; then
        sed "s|$pattern|$replacement|g" "$file" > "$file.new" && chmod --reference="$file" "$file.new" && mv -f "$file.new" "$file"
      fi
    done
    rm -f .venv/.pscluster-cache-origin
    if said=$(.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>&1); then
      echo "bootstrap: .venv linked from this machine's cache ($cached)"
    else
      printf '%s\n' "$said" | tail -20 >&2
      echo "bootstrap: the cached venv did not take pscluster; installing afresh" >&2
      rm -rf .venv
    fi
  else
    rm -rf .venv
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$want $profile" ] && [ "$have" != "$want test" ]; then
  echo "bootstrap: installing pscluster[$extras] into .venv (first time: ~1 minute)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$extras]"
  if [ "$profile" = test ]; then
    # Legacy Keras (setup.cfg's legacy-keras extra): the tests of `run --keras legacy` and the
    # tf-keras baseline benchmark need it. --no-deps: tf-keras depends on the `tensorflow`
    # distribution, and pip would pull that whole wheel over tensorflow-cpu (measured with
    # `pip install --dry-run tf-keras==2.21.0`: "Would install tensorflow-2.21.0").
    .venv/bin/python -m pip install -q --no-deps tf-keras==2.21.0
  fi
  echo "$want $profile" > "$stamp.new" && mv -f "$stamp.new" "$stamp"     # a new file: it may be a hard link
  if [ -n "$cached" ] && [ ! -e "$cached" ] && mkdir -p "$cache_root"; then     # for the next clean clone
    if cp -al .venv "$cached.tmp$$" 2>/dev/null; then
      echo "$PWD/.venv" > "$cached.tmp$$/.pscluster-cache-origin"
      mv -T "$cached.tmp$$" "$cached" 2>/dev/null || rm -rf "$cached.tmp$$"
    else
      rm -rf "$cached.tmp$$"
    fi
    # The three newest stay: an older one holds its own copy of every file once the clone it was
    # linked from is gone (~1.5 GB).
    ls -1dt "$cache_root"/*/ 2>/dev/null | tail -n +4 | while read -r old; do rm -rf "$old"; done
  fi
fi
