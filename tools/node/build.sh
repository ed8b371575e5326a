#!/usr/bin/env bash
# Build the local node's binaries once per pinned version, and make sure the Debian packages
# the node runs on are installed.
#
#   kubelet, kube-scheduler, kube-proxy   k8s.io/kubernetes (this directory's wrapper module)
#   buildkitd, buildctl                   github.com/moby/buildkit (buildkit/: a wrapper module of its own)
#   pause                                 pause.c, gcc -static: the Pods' sandbox process
#   Debian: containerd runc containernetworking-plugins iptables nftables debootstrap (+ gcc libc6-dev
#   to compile pause); installed with apt-get when missing, which needs root.
#
# Output: a directory holding the binaries, printed as the last line of stdout (logs go to
# stderr). Idempotent: when every binary is already there it returns at once.
#
#   tools/node/build.sh                          # build (or find) and print the directory
#   declop assets build --node                   # the same, from an installed declop (its copy)
#   DECLOP_NODE_ASSETS_DIR=/some/dir build.sh    # build into a chosen directory
set -euo pipefail

# -P: the real folder (tools/node in a checkout, also when run through the link declop/assets/node).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
K8S_VERSION="v1.36.3"          # the control plane's (declop/assets/controlplane/go.mod)
BUILDKIT_MODULE="github.com/moby/buildkit"
BUILDKIT_VERSION="$(awk '$1 == "github.com/moby/buildkit" { print $2; exit }' "$HERE/buildkit/go.mod")"
BINARIES=(kubelet kube-scheduler kube-proxy buildkitd buildctl pause)
# DECLOP_NODE_DEB_PACKAGES replaces the list (the tests use it to ask for a missing package).
read -r -a PACKAGES <<<"${DECLOP_NODE_DEB_PACKAGES:-containerd runc containernetworking-plugins iptables nftables debootstrap gcc libc6-dev}"

say() { printf '[node] %s\n' "$*" >&2; }

# ---- Debian packages: installed only when dpkg says they are missing ----
missing_pkgs=()
for p in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
    [[ $status == "install ok installed" ]] || missing_pkgs+=("$p")
done
if [[ ${#missing_pkgs[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        say "error: the local node needs the Debian packages ${missing_pkgs[*]}, and installing them needs root: run this as root, or 'sudo apt-get install -y --no-install-recommends ${missing_pkgs[*]}' first"
        exit 2
    fi
    say "apt-get install ${missing_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing_pkgs[@]}" >&2; then
        say "apt-get install failed; refreshing the package lists and trying once more"
        apt-get update -q >&2
        apt-get install -y -q --no-install-recommends "${missing_pkgs[@]}" >&2
    fi
fi

if ! command -v go >/dev/null 2>&1; then
    say "error: 'go' is not on PATH; install Go >= 1.26 (https://go.dev/doc/install or your distribution's golang package) and run this again"
    exit 2
fi

# Contents only, so any checkout shares the cache; BuildKit's module and pause.c are inputs too.
sum="$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/buildkit/go.mod" "$HERE/buildkit/go.sum" "$HERE/pause.c" | sha256sum | cut -c1-12)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/declop/node"
out="${DECLOP_NODE_ASSETS_DIR:-$cache_root/$K8S_VERSION-$sum}"

# The control plane's shared functions: beside this folder in an installed declop
# (declop/assets/{node,controlplane}), under declop/assets/ from a checkout's tools/node.
COMMON="$HERE/../controlplane/common.sh"
[[ -f $COMMON ]] || COMMON="$HERE/../../declop/assets/controlplane/common.sh"
# shellcheck source=../../declop/assets/controlplane/common.sh
source "$COMMON"
exit_if_built
lock_folder
exit_if_built

say "building ${missing[*]} into $out"
say "with a warm Go build cache (the control plane built before) this takes ~8 minutes on a fresh 2-core machine, BuildKit most of it; later runs take a second"

kubernetes_version_flags
buildkit_flags="-X $BUILDKIT_MODULE/version.Version=$BUILDKIT_VERSION -X $BUILDKIT_MODULE/version.Package=$BUILDKIT_MODULE"
buildkit_flags+=" -X $BUILDKIT_MODULE/version.Revision=declop-wrapper"

export CGO_ENABLED=0
cd "$HERE"
step=0
began=$SECONDS
for b in "${missing[@]}"; do
    step=$((step + 1))
    start=$SECONDS
    case $b in
    kubelet | kube-scheduler | kube-proxy)
        say "[$step/${#missing[@]}] go build k8s.io/kubernetes/cmd/$b"
        go build -trimpath -tags selinux,notest -ldflags "-s -w$version_flags" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b"
        ;;
    buildkitd | buildctl)
        # Upstream's release flags: static, no cgo (runc is the Debian binary on PATH).
        tags=""
        [[ $b == buildkitd ]] && tags="osusergo netgo static_build seccomp"
        say "[$step/${#missing[@]}] go build $BUILDKIT_MODULE/cmd/$b ($BUILDKIT_VERSION)"
        (cd "$HERE/buildkit" && go build -trimpath -tags "$tags" -ldflags "-s -w $buildkit_flags" -o "$out/$b.tmp" "$BUILDKIT_MODULE/cmd/$b")
        ;;
    pause)
        say "[$step/${#missing[@]}] gcc -static pause.c"
        gcc -static -O2 -s -Wall -Wextra -o "$out/$b.tmp" "$HERE/pause.c"
        ;;
    esac
    mv "$out/$b.tmp" "$out/$b"   # atomic: a half-built binary never looks finished
    say "built $b in $((SECONDS - start)) s ($((SECONDS - began)) s so far)"
done
say "done in $((SECONDS - began)) s: $out"
echo "$out"
