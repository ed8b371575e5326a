#!/usr/bin/env bash
# make pin-base: point the Dockerfile's default base (ARG PYTHON_IMAGE=<tag>@sha256:<digest>) at
# the digest its tag has now, asked of the registry with curl (Docker Hub's token + manifest API),
# and record where the digest came from on the "# base-digest-source:" line.
#
#   tools/pin-base.sh                  # the tag already in the Dockerfile
#   tools/pin-base.sh python:3.11-slim-bookworm   # another tag
#
# The digest is the tag's multi-platform index (what `docker buildx imagetools inspect` prints as
# Digest), so builds for any platform stay pinned. Without the registry: one line, exit 1, and the
# Dockerfile is left as it was. DECLOP_REGISTRY / DECLOP_REGISTRY_AUTH / DOCKERFILE override where
# it asks and what it edits (the tests use them).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=${DOCKERFILE:-$root/Dockerfile}
registry=${DECLOP_REGISTRY:-https://registry-1.docker.io}
auth=${DECLOP_REGISTRY_AUTH:-https://auth.docker.io/token?service=registry.docker.io}

die() { echo "error: $*" >&2; exit 1; }

current=$(grep -m1 '^ARG PYTHON_IMAGE=' "$dockerfile" | cut -d= -f2-) \
  || die "$dockerfile has no 'ARG PYTHON_IMAGE=' line"
image=${1:-${current%@*}}
case $image in
  *@*) die "give a tag, not a digest: ${image}" ;;
  *:*) repo=${image%:*} tag=${image##*:} ;;
  *) repo=$image tag=latest ;;
esac
path=$repo
case $path in */*) ;; *) path=library/$path ;; esac

token=$(curl -fsS --max-time 20 "$auth&scope=repository:$path:pull" 2>/dev/null \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])' 2>/dev/null) \
  || die "cannot get a pull token for $path from ${auth%%\?*} (no registry access?); the Dockerfile is unchanged"
headers=$(curl -fsS --max-time 20 --head \
  -H "Authorization: Bearer $token" \
  -H "Accept: application/vnd.oci.image.index.v1+json" \
  -H "Accept: application/vnd.docker.distribution.manifest.list.v2+json" \
  "$registry/v2/$path/manifests/$tag" 2>/dev/null) \
  || die "cannot read the manifest of $image from $registry (unknown tag or no registry access); the Dockerfile is unchanged"
digest=$(printf '%s\n' "$headers" | tr -d '\r' | awk 'tolower($1) == "docker-content-digest:" {print $2}')
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "$registry sent no Docker-Content-Digest for $image; the Dockerfile is unchanged"

pinned="$image@$digest"
source_line="# base-digest-source: $registry, tools/pin-base.sh on $(date -u +%Y-%m-%d)"
tmp=$(mktemp "$dockerfile.XXXXXX")
awk -v pinned="$pinned" -v source_line="$source_line" '
  /^ARG PYTHON_IMAGE=/ && !done { print "ARG PYTHON_IMAGE=" pinned; done = 1; next }
  /^# base-digest-source:/ { print source_line; next }
  { print }
' "$dockerfile" >"$tmp"
chmod --reference="$dockerfile" "$tmp"
mv "$tmp" "$dockerfile"
if [[ $current == "$pinned" ]]; then
  echo "$pinned (unchanged)"
else
  echo "$pinned (was $current)"
fi
