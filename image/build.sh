#!/usr/bin/env bash
# Builds the image with whatever this machine has: docker, podman or buildah, in that order
# (CONTAINER_TOOL=... chooses). `make image`, `make image-local` and their -mpi and -ray
# variants call it.
#
#   image/build.sh release  # the CUDA image, $IMAGE (default ghcr.io/kfp-ddp/kfp-ddp:VERSION);
#                           # pulls the pytorch/pytorch base and PyPI
#   image/build.sh local    # the CPU image localhost/kfp-ddp:VERSION-cpu with no registry at all:
#                           # a Debian base made by mmdebstrap from Debian's mirror, the wheels
#                           # downloaded by this machine's pip (its configuration: index, proxy,
#                           # find-links) and mounted into the build (podman, buildah)
#   image/build.sh release-mpi  # $IMAGE-mpi: the CUDA image plus OpenMPI and sshd (image/mpi/),
#                               # for Kubeflow Trainer MPI runtimes; apt in the build
#   image/build.sh local-mpi    # localhost/kfp-ddp:VERSION-cpu-mpi: the same on the CPU image,
#                               # without network (the Debian packages downloaded by this
#                               # machine's apt, which must be Debian bookworm, mounted at /debs)
#   image/build.sh release-ray  # $IMAGE-ray: the CUDA image with pyproject.toml's `ray` extra
#                               # (--build-arg EXTRAS=ray), for a RayJob's pods (api=rayjob)
#   image/build.sh local-ray    # localhost/kfp-ddp:VERSION-cpu-ray: the same on the CPU image,
#                               # without network (ray's wheels join the wheelhouse)
#
# The -ray images come from the Dockerfile itself: its extras' layer follows the dependency layer,
# which they share with the plain image from the build cache.
#
# Prints the built image's name last. The local image carries a label with a hash of everything
# that goes into it; a second run with nothing changed builds nothing. Caches (the base's tarball,
# the wheelhouse) live in $KFP_DDP_IMAGE_CACHE (default ~/.cache/kfp-ddp/image).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
CACHE=${KFP_DDP_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kfp-ddp/image}
PYTHON=${PYTHON:-python3}
LOCAL_BASE=${LOCAL_BASE:-localhost/kfp-ddp-base:bookworm}
SUITE=bookworm  # its Python (3.11) is the one the CPU torch wheel is built for
INPUTS_LABEL=io.kfp-ddp.inputs

say() { echo "[image] $*" >&2; }

pick_tool() {
  if [[ -n "${CONTAINER_TOOL:-}" ]]; then echo "$CONTAINER_TOOL"; return; fi
  if command -v docker > /dev/null && docker info > /dev/null 2>&1; then echo docker; return; fi
  for tool in podman buildah; do
    if command -v "$tool" > /dev/null; then echo "$tool"; return; fi
  done
  say "no container tool: install docker, podman or buildah (Debian: apt-get install podman runc)"
  exit 1
}
TOOL=$(pick_tool)
if [[ "$TOOL" != docker && -z "${CONTAINERS_CONF:-}" ]]; then
  export CONTAINERS_CONF=$PWD/image/containers.conf
fi

# A hash of every file the build reads (the Dockerfile's COPYs and the build's own files).
inputs_hash() {
  find Dockerfile .dockerignore pyproject.toml constraints.txt README.md image kfp_ddp trainer \
    components pipelines -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path 'image/mpi/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

image_label() {  # the label's value on a local image, empty if there is no such image
  case "$TOOL" in
    buildah) buildah inspect --type image --format "{{index .ImageAnnotations \"x\"}}{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null || true ;;
    *) "$TOOL" image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true ;;
  esac
}

has_image() { [[ -n "$(image_label "$1" org.opencontainers.image.title)$("$TOOL" images -q "$1" 2>/dev/null)" ]]; }

build() {  # build ARGS... (the context is the repository)
  case "$TOOL" in
    docker) docker build "$@" . ;;
    podman) podman build --layers "$@" . ;;
    buildah) buildah bud --layers "$@" . ;;
    *) say "CONTAINER_TOOL=$TOOL: expected docker, podman or buildah"; exit 2 ;;
  esac
}

local_base() {
  if has_image "$LOCAL_BASE"; then return; fi
  local tarball=$CACHE/base-$SUITE.tar
  if [[ -d "$tarball" ]]; then rm -rf "$tarball"; fi  # a folder an older build.sh left there
  if [[ ! -s "$tarball" ]]; then
    command -v mmdebstrap > /dev/null || { say "the local base needs mmdebstrap (apt-get install mmdebstrap)"; exit 1; }
    say "making the base $LOCAL_BASE from Debian $SUITE with mmdebstrap (~90 s)"
    mkdir -p "$CACHE"
    # --format=tar: mmdebstrap picks the format from the name, and ".tmp" made it a folder.
    mmdebstrap --quiet --format=tar --variant=minbase \
      --include=python3,python3-venv,ca-certificates "$SUITE" "$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
  fi
  case "$TOOL" in
    buildah) local ctr; ctr=$(buildah from scratch); buildah add "$ctr" "$tarball" /
             buildah commit --rm "$ctr" "$LOCAL_BASE" > /dev/null ;;
    *) "$TOOL" import "$tarball" "$LOCAL_BASE" > /dev/null ;;
  esac
}

wheelhouse() {  # wheelhouse [EXTRAS]: prints the folder of every wheel the CPU image installs
  local extras=${1:-} requirements key folder
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    say "PYTHON=$PYTHON is not Python 3.11, the base's: its wheels would not install there"
    exit 1
  fi
  requirements=$("$PYTHON" image/dependencies.py pyproject.toml)
  key=$( { echo "$requirements"; cat constraints.txt; } | sha256sum | cut -c1-16)
  folder=$CACHE/wheels-$key
  if [[ ! -f "$folder/COMPLETE" ]]; then
    say "downloading the wheels into $folder (this machine's pip settings)"
    rm -rf "$folder.tmp" && mkdir -p "$folder.tmp"
    # pip wheel, not download: a package published as source only (kfp) is built here, once.
    if ! "$PYTHON" -m pip wheel --quiet --wheel-dir "$folder.tmp" -c constraints.txt \
        torch torchvision setuptools \
        -r <(echo "$requirements") > "$folder.log" 2>&1; then
      grep -v "is ignored: it is neither a file nor a directory" "$folder.log" >&2
      say "pip wheel failed (log: $folder.log)"
      exit 1
    fi
    touch "$folder.tmp/COMPLETE"
    rm -rf "$folder" && mv "$folder.tmp" "$folder"
  fi
  if [[ -n "$extras" ]]; then folder=$(extras_wheelhouse "$folder" "$extras"); fi
  echo "$folder"
}

# extras_wheelhouse FOLDER EXTRAS: prints a folder of FOLDER's wheels (hard links) plus those of
# EXTRAS' dependencies, with constraints.txt's pins.
extras_wheelhouse() {
  local base=$1 extras=$2 requirements key folder
  requirements=$("$PYTHON" image/dependencies.py pyproject.toml --only-extras "$extras")
  key=$( { echo "$base"; echo "$requirements"; cat constraints.txt; } | sha256sum | cut -c1-16)
  folder=$CACHE/wheels-$key
  if [[ ! -f "$folder/COMPLETE" ]]; then
    say "downloading the wheels of the extras $extras into $folder (this machine's pip settings)"
    rm -rf "$folder.tmp" && mkdir -p "$folder.tmp"
    cp -l "$base"/*.whl "$folder.tmp"/ 2> /dev/null || cp "$base"/*.whl "$folder.tmp"/
    if ! "$PYTHON" -m pip wheel --quiet --wheel-dir "$folder.tmp" --find-links "$folder.tmp" \
        -c constraints.txt -r <(echo "$requirements") > "$folder.log" 2>&1; then
      grep -v "is ignored: it is neither a file nor a directory" "$folder.log" >&2
      say "pip wheel failed (log: $folder.log)"
      exit 1
    fi
    touch "$folder.tmp/COMPLETE"
    rm -rf "$folder" && mv "$folder.tmp" "$folder"
  fi
  echo "$folder"
}

# What the MPI layer installs (image/mpi/Containerfile); the .deb files of them and of every
# dependency the image lacks, downloaded by this machine's apt against the image's own package
# list (so exactly what dpkg needs there, nothing installed here).
MPI_PACKAGES=(openmpi-bin openssh-server openssh-client)

image_file() {  # image_file IMAGE PATH: prints a file of the image
  case "$TOOL" in
    buildah) local ctr; ctr=$(buildah from --pull-never "$1" 2>/dev/null)
             buildah run --network=none "$ctr" cat "$2"; buildah rm "$ctr" > /dev/null ;;
    *) "$TOOL" run --rm --network=none --user 0 --entrypoint cat "$1" "$2" ;;
  esac
}

mpi_debs() {  # mpi_debs IMAGE: prints the folder of the .deb files the MPI layer installs
  local status key folder
  command -v apt-get > /dev/null || { say "local-mpi downloads Debian packages with apt-get (a Debian bookworm machine)"; exit 1; }
  grep -q '^VERSION_CODENAME=bookworm' /etc/os-release \
    || { say "local-mpi needs this machine's apt to be Debian bookworm's, the base's"; exit 1; }
  status=$(mktemp)
  image_file "$1" /var/lib/dpkg/status > "$status"
  key=$( { echo "${MPI_PACKAGES[*]}"; cat "$status"; } | sha256sum | cut -c1-16)
  folder=$CACHE/debs-$key
  if [[ ! -f "$folder/COMPLETE" ]]; then
    say "downloading ${MPI_PACKAGES[*]} and what the image lacks of their dependencies into $folder"
    rm -rf "$folder.tmp" && mkdir -p "$folder.tmp/partial"
    download() {
      apt-get install -qq --download-only --no-install-recommends -y \
        -o Dir::State::status="$status" -o Dir::Cache::archives="$folder.tmp" \
        -o Debug::NoLocking=1 "${MPI_PACKAGES[@]}" > "$folder.tmp.log" 2>&1
    }
    local got=no
    if download; then got=yes
    # No package lists here (a slim machine): root fetches them once, then tries again.
    elif [[ "$(id -u)" == 0 ]] && apt-get update -qq > /dev/null 2>&1 && download; then got=yes
    fi
    if [[ "$got" != yes ]]; then
      cat "$folder.tmp.log" >&2
      say "apt-get could not download them (is 'apt-get update' needed?)"
      rm -f "$status"
      exit 1
    fi
    rm -rf "$folder.tmp/partial" "$folder.tmp/lock" "$folder.tmp.log"
    touch "$folder.tmp/COMPLETE"
    rm -rf "$folder" && mv "$folder.tmp" "$folder"
  fi
  rm -f "$status"
  echo "$folder"
}

build_mpi() {  # build_mpi BASE NAME [EXTRA...]: the MPI layer on BASE
  local base=$1 name=$2 hash
  shift 2
  hash=$( { "$TOOL" image inspect --format '{{.Id}}' "$base" 2>/dev/null || echo "$base"; \
            cat image/mpi/*; } | sha256sum | cut -c1-16)
  if [[ "$(image_label "$name" "$INPUTS_LABEL")" == "$hash" ]]; then
    say "$name is up to date (inputs $hash)"
    return
  fi
  say "building $name (MPI on $base) with $TOOL, inputs $hash"
  case "$TOOL" in
    docker) docker build --build-arg "BASE_IMAGE=$base" "$@" --label "$INPUTS_LABEL=$hash" -t "$name" image/mpi ;;
    podman) podman build --build-arg "BASE_IMAGE=$base" "$@" --label "$INPUTS_LABEL=$hash" -t "$name" image/mpi ;;
    buildah) buildah bud --build-arg "BASE_IMAGE=$base" "$@" --label "$INPUTS_LABEL=$hash" -t "$name" image/mpi ;;
  esac
}

# build_local NAME [EXTRAS]: the CPU image (with EXTRAS), unless NAME is up to date.
build_local() {
  local name=$1 extras=${2:-} hash wheels
  hash=$(inputs_hash)${extras:+-$extras}
  if [[ "$(image_label "$name" "$INPUTS_LABEL")" == "$hash" ]]; then
    say "$name is up to date (inputs $hash)"
    return
  fi
  say "building $name (CPU${extras:+, extras $extras}) with $TOOL, inputs $hash"
  local_base
  local extra=(--pull=never --network=none)  # no network: the wheels are mounted
  if [[ "$TOOL" == docker ]]; then
    extra=()  # docker build cannot mount the wheelhouse: torch from PyTorch's CPU index
  else
    wheels=$(wheelhouse "$extras")
    extra+=(--volume "$wheels:/wheels:ro")
  fi
  build "${common[@]}" "${extra[@]}" --build-arg VARIANT=cpu --build-arg "BASE_IMAGE=$LOCAL_BASE" \
    --build-arg "EXTRAS=$extras" --label "$INPUTS_LABEL=$hash" -t "$name"
}

common=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION")
case "${1:-}" in
  release)
    name=${IMAGE:-ghcr.io/kfp-ddp/kfp-ddp:$VERSION}
    say "building $name (CUDA) with $TOOL"
    build "${common[@]}" -t "$name"
    ;;
  release-mpi)
    base=${IMAGE:-ghcr.io/kfp-ddp/kfp-ddp:$VERSION}
    has_image "$base" || { say "no $base here: build it first (image/build.sh release)"; exit 1; }
    name=$base-mpi
    build_mpi "$base" "$name"
    ;;
  release-ray)
    name=${IMAGE:-ghcr.io/kfp-ddp/kfp-ddp:$VERSION}-ray
    say "building $name (CUDA, extras ray) with $TOOL"
    build "${common[@]}" --build-arg EXTRAS=ray -t "$name"
    ;;
  local-mpi)
    base=$("$0" local | tail -n 1)
    name=$base-mpi
    extra=(--pull=never --network=none --volume "$(mpi_debs "$base"):/debs:ro")
    [[ "$TOOL" == docker ]] && extra=()  # docker build cannot mount them: apt in the build
    build_mpi "$base" "$name" "${extra[@]}"
    ;;
  local)
    name=${IMAGE:-localhost/kfp-ddp:$VERSION-cpu}
    build_local "$name"
    ;;
  local-ray)
    name=${IMAGE:-localhost/kfp-ddp:$VERSION-cpu}-ray
    build_local "$name" ray
    ;;
  *)
    echo "usage: $0 release|local|release-mpi|local-mpi|release-ray|local-ray" >&2
    exit 2
    ;;
esac
echo "$name"
