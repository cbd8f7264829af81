#!/usr/bin/env bash
# Builds the tool server's image (compose/Dockerfile) with whichever engine this machine has:
# docker if its daemon answers, else podman. `make image` runs it; so does tests/deploy/test_image.py.
#
#   compose/image.sh [build]   build toolfactory/tool-server:latest (layers reused); prints the engine
#   compose/image.sh engine    print the engine it would use (docker or podman), or fail saying why
#   compose/image.sh base      print the base image it would build from (bootstrapping it if needed)
#
# The base: $BASE_IMAGE if set; else python:3.11-slim when it is here already or its registry
# answers; else a Debian bookworm root bootstrapped from Debian's archive with mmdebstrap
# (python3 and a venv on PATH, as python:3.11-slim has pip on PATH), cached as a tarball under
# $TOOLFACTORY_IMAGE_CACHE (default ~/.cache/toolfactory/images) and imported once.
#
# Podman host quirks (written once, only where this host has them, so plain `podman run` works):
# crun cannot raise rlimits without CAP_SYS_RESOURCE, and refuses a hybrid cgroup v1/v2 host.
# Both go into a containers.conf.d drop-in. Where outbound TLS is intercepted, pip in the build
# needs the host's CA bundle: podman builds mount it (with a pip.conf pointing at it) read-only
# into the build only; the image does not keep it.
set -euo pipefail

IMAGE=${IMAGE:-toolfactory/tool-server:latest}
DEFAULT_BASE=python:3.11-slim
DEBIAN_BASE=localhost/toolfactory/debian-python:3.11-bookworm
CACHE=${TOOLFACTORY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolfactory/images}
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
ROOT=$(cd -P "$(dirname "$0")/.." && pwd)  # -P: the checkout itself, also through a symlinked compose/

say() { echo "image.sh: $*" >&2; }

engine() {
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        echo docker
    elif command -v podman >/dev/null 2>&1; then
        echo podman
    else
        say "neither a docker daemon nor podman here; \`make setup\` installs podman (apt-get)"
        return 1
    fi
}

# Quirks of this host that stop podman's default runtime (crun): rlimits it may not raise, and a
# hybrid cgroup hierarchy. The drop-in sets them only where found; an existing one is left alone.
podman_host_config() {
    if [ "$(id -u)" = 0 ]; then dir=/etc/containers/containers.conf.d; else dir=$HOME/.config/containers/containers.conf.d; fi
    conf=$dir/50-toolfactory-host.conf
    [ -e "$conf" ] && return 0
    caps=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    no_sys_resource=$(( (0x$caps >> 24 & 1) == 0 ))  # CAP_SYS_RESOURCE is bit 24
    hybrid=0
    if [ "$(stat -fc %T /sys/fs/cgroup)" = tmpfs ] && [ -d /sys/fs/cgroup/unified ]; then hybrid=1; fi
    [ "$no_sys_resource" = 1 ] || [ "$hybrid" = 1 ] || return 0
    mkdir -p "$dir"
    {
        echo "# Written by toolfactory's compose/image.sh for this host's quirks; delete to undo."
        if [ "$no_sys_resource" = 1 ]; then
            echo "[containers]"
            # podman lowers its own nproc to 32768 (measured, podman 4.3), and runc cannot go above it.
            nproc_soft=$(ulimit -Su) nproc_hard=$(ulimit -Hu)
            [ "$nproc_soft" = unlimited ] || [ "$nproc_soft" -gt 32768 ] && nproc_soft=32768
            [ "$nproc_hard" = unlimited ] || [ "$nproc_hard" -gt 32768 ] && nproc_hard=32768
            echo "# No CAP_SYS_RESOURCE: containers keep this host's limits (podman would raise them)."
            echo "default_ulimits = [\"nofile=$(ulimit -Sn):$(ulimit -Hn)\", \"nproc=$nproc_soft:$nproc_hard\"]"
        fi
        if [ "$hybrid" = 1 ]; then
            echo "[engine]"
            echo "# A hybrid cgroup v1/v2 host, which crun refuses."
            echo "runtime = \"runc\""
        fi
    } >"$conf"
    say "wrote $conf (this host's podman quirks)"
}

registry_answers() {
    # Docker Hub's registry answers 401 to an anonymous /v2/ when it is reachable.
    python3 - <<'EOF' 2>/dev/null
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=10)
except urllib.error.HTTPError:
    sys.exit(0)
except Exception:
    sys.exit(1)
EOF
}

# A python:3.11-slim stand-in from Debian's archive: bookworm's python3 (3.11) with a venv on
# PATH (Debian's own pip refuses to install into the system Python, PEP 668).
bootstrap_debian_base() {
    tarball=$CACHE/debian-python-3.11-bookworm.tar
    if [ ! -s "$tarball" ]; then
        command -v mmdebstrap >/dev/null 2>&1 || { say "no registry answers and mmdebstrap is missing; \`make setup\` installs it"; return 1; }
        mkdir -p "$CACHE"
        rm -f "$tarball.part"  # an interrupted bootstrap's
        say "bootstrapping $DEBIAN_BASE from Debian's archive (a few minutes, once; cached in $tarball)"
        nice -n 10 mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
            bookworm "$tarball.part" \
            "deb http://deb.debian.org/debian bookworm main" \
            "deb http://deb.debian.org/debian bookworm-updates main" \
            "deb http://deb.debian.org/debian-security bookworm-security main"
        mv "$tarball.part" "$tarball"
    fi
    "$1" import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$tarball" "$DEBIAN_BASE" >/dev/null
}

has_image() { "$1" image inspect "$2" >/dev/null 2>&1; }

base() {
    if [ -n "${BASE_IMAGE:-}" ]; then
        echo "$BASE_IMAGE"
    elif has_image "$1" "$DEFAULT_BASE" || registry_answers; then
        echo "$DEFAULT_BASE"
    else
        has_image "$1" "$DEBIAN_BASE" || bootstrap_debian_base "$1"
        echo "$DEBIAN_BASE"
    fi
}

# One build at a time on this machine (test workers, the docs runner): the others then reuse its
# base and layers instead of bootstrapping or pruning beside it.
one_at_a_time() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/build.lock"
    flock 9
}

build() {
    eng=$(engine)
    one_at_a_time
    [ "$eng" = podman ] && podman_host_config
    from=$(base "$eng")
    say "building $IMAGE with $eng from $from"
    set -- --build-arg "BASE_IMAGE=$from" -f "$ROOT/compose/Dockerfile" -t "$IMAGE"
    if [ "$eng" = podman ]; then
        # --format docker keeps the HEALTHCHECK (OCI images have no such field).
        set -- "$@" --format docker --layers
        if [ -r "$HOST_CA" ]; then
            mkdir -p "$CACHE"
            printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$CACHE/build-pip.conf"
            set -- "$@" -v "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" -v "$CACHE/build-pip.conf:/etc/pip.conf:ro"
        fi
    fi
    nice -n 10 "$eng" build "$@" "$ROOT" >&2
    # Images of earlier builds that later ones replaced (untagged, unused, over an hour old): each
    # source change leaves some.
    "$eng" image prune -f --filter until=60m \
        --filter "label=org.opencontainers.image.title=toolfactory-tool-server" >/dev/null || true
    echo "$IMAGE"
}

case "${1:-build}" in
    build) build ;;
    engine) engine ;;
    base) eng=$(engine); one_at_a_time; [ "$eng" = podman ] && podman_host_config; base "$eng" ;;
    *) say "usage: $0 [build|engine|base]"; exit 2 ;;
esac
