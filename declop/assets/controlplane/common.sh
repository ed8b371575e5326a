# Shared by declop/assets/controlplane/build.sh and tools/node/build.sh (sourced, not run).
# Each script defines `say`, BINARIES, K8S_VERSION, `sum` and `out` first.

# Sets `missing`; when nothing is, prints the folder and exits.
exit_if_built() {
    missing=()
    for b in "${BINARIES[@]}"; do
        [[ -x "$out/$b" ]] || missing+=("$b")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "up to date: $out"
        echo "$out"
        exit 0
    fi
}

# One build per folder at a time: two at once (two terminals, parallel test sessions) would
# write the same .tmp files. The second waits for the first, then (exit_if_built again) finds
# the binaries it built. The lock is fd 9, held until the script exits. Without flock(1)
# (util-linux; macOS lacks it) there is no lock: one build at a time is then up to the user.
lock_folder() {
    mkdir -p "$out"
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$out/.build.lock"
    if ! flock -n 9; then
        say "another build into $out is running; waiting for it"
        flock 9
    fi
}

# Sets `version_flags`: the -ldflags -X values that make the binaries report K8S_VERSION.
kubernetes_version_flags() {
    local minor pkg build_date
    minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    version_flags=""
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        version_flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        version_flags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=declop-wrapper-$sum -X $pkg.buildDate=$build_date"
    done
}
