#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# etcd, kubectl) and helm from the Go module proxy, once per pinned version.
#
# Ships inside the declop package beside its wrapper Go module (go.mod, go.sum), so an
# installed wheel can build too; `declop assets build` runs it (declop/assets/__init__.py).
# The Kubernetes version is go.mod's k8s.io/kubernetes; the cache key is the sha256 of
# go.mod + go.sum, computed the same way by declop.assets.
#
# Output: a directory laid out like KUBEBUILDER_ASSETS, printed as the last line
# of stdout. Idempotent: when every binary is already there it returns at once (no Go needed).
#
#   declop assets build                    # build (or find) and print the directory
#   bash declop/assets/controlplane/build.sh   # the same, from a checkout without a venv
#   DECLOP_ASSETS_DIR=/some/dir build.sh   # build into a chosen directory
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$HERE/go.mod")"
HELM_MODULE="helm.sh/helm/v3"
HELM_VERSION="v3.22.0"
BINARIES=(kube-apiserver kube-controller-manager etcd kubectl helm)

say() { printf '[controlplane] %s\n' "$*" >&2; }

sum="$(cat "$HERE/go.mod" "$HERE/go.sum" | sha256sum | cut -c1-12)"  # contents only: any checkout shares the cache
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/declop/controlplane"
out="${DECLOP_ASSETS_DIR:-$cache_root/$K8S_VERSION-$sum}"

# shellcheck source=common.sh
source "$HERE/common.sh"
exit_if_built

if ! command -v go >/dev/null 2>&1; then
    say "error: 'go' is not on PATH; install Go >= 1.26 (https://go.dev/doc/install or your distribution's golang package) and run this again"
    exit 2
fi
lock_folder
exit_if_built

say "building ${missing[*]} for Kubernetes $K8S_VERSION into $out"
say "the first build downloads ~1 GB of modules and takes ~15 minutes on a fresh 2-core machine (kube-apiserver, the first, about half of it); later runs take seconds"

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
kubernetes_version_flags

export CGO_ENABLED=0
cd "$HERE"
declare -A package=(
    [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
    [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
    [kubectl]=k8s.io/kubernetes/cmd/kubectl
    [etcd]=go.etcd.io/etcd/server/v3
)
step=0
began=$SECONDS
for b in "${missing[@]}"; do
    step=$((step + 1))
    start=$SECONDS
    if [[ $b == helm ]]; then
        say "[$step/${#missing[@]}] go install $HELM_MODULE/cmd/helm@$HELM_VERSION"
        tmpbin="$(mktemp -d)"
        GOBIN="$tmpbin" go install -trimpath \
            -ldflags "-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION -X $HELM_MODULE/pkg/chartutil.k8sVersionMajor=1 -X $HELM_MODULE/pkg/chartutil.k8sVersionMinor=$minor" \
            "$HELM_MODULE/cmd/helm@$HELM_VERSION"
        mv "$tmpbin/helm" "$out/helm.tmp"
        rmdir "$tmpbin"
    else
        say "[$step/${#missing[@]}] go build ${package[$b]}"
        go build -trimpath -tags selinux,notest -ldflags "-s -w$version_flags" -o "$out/$b.tmp" "${package[$b]}"
    fi
    mv "$out/$b.tmp" "$out/$b"   # atomic: a half-built binary never looks finished
    say "built $b in $((SECONDS - start)) s ($((SECONDS - began)) s so far)"
done
say "done in $((SECONDS - began)) s: $out"
echo "$out"
