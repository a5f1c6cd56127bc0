#!/usr/bin/env python3
"""Assertions on the Helm chart's renders that schema validation cannot make (run by check-chart.sh).

Every render of ci/*.yaml (made by check-chart.sh) and a few made here are checked for: native gRPC
probes on a numeric port with the right health services; non-root pods with a read-only root filesystem;
the rules ConfigMap mounted as a directory (no subPath) and without a checksum annotation; a grace period
longer than the drain period; workerThreads rendered only when set; no replicas when the HPA is on; PDB,
HPA, ServiceMonitor and NetworkPolicy off by default; no secret in any ConfigMap; and `tollgate
check-config` passing on the rules rendered from the default values (and failing on a broken rule).
Values that must fail the render are tried too.

The PrometheusRule and the Grafana dashboard are checked for shape (kubernetes-validate has no schema for
the PrometheusRule's CRD; the dashboard is JSON inside a ConfigMap), and every PromQL expression in them
may name only series and labels Tollgate's /metrics writes. Those are read from the Rust source that
writes them (src/observe/prometheus.rs, go_series.rs, text_format.rs and process.rs, and the core's
observe/metrics.rs), not from a
list kept here, so a renamed metric fails the check instead of leaving a dashboard panel silently empty.
"""

import argparse
import base64
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

RULES_DIR = "/etc/tollgate/rules"
SECRET_NAME = re.compile(r"AUTH|PASSWORD|PASSWD|SECRET|TOKEN|HASH_KEY|REFUND_KEY(?!_FILE)|CREDENTIAL", re.I)
URL_CREDENTIALS = re.compile(r"://[^/\s]*:[^/\s]*@")

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
    return condition


class Render:
    """The parsed documents of one `helm template` output."""

    def __init__(self, name, text):
        self.name = name
        self.docs = [d for d in yaml.safe_load_all(text) if d]

    def of(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def hooks(self, kind):
        return [d for d in self.of(kind) if "helm.sh/hook" in d["metadata"].get("annotations", {})]

    def tollgate_deployment(self):
        deployments = [
            d for d in self.of("Deployment")
            if any(c["name"] == "tollgate" for c in d["spec"]["template"]["spec"]["containers"])
        ]
        check(len(deployments) == 1, f"{self.name}: expected one Tollgate Deployment, got {len(deployments)}")
        return deployments[0]

    def settings(self):
        maps = [c for c in self.of("ConfigMap") if c["metadata"]["name"].endswith("-settings")]
        check(len(maps) == 1, f"{self.name}: expected one settings ConfigMap")
        return maps[0]["data"]


def pod_specs(render):
    """Every pod spec in the render, with a label."""
    for d in render.docs:
        if d["kind"] in ("Deployment", "Job"):
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield f"Pod/{d['metadata']['name']}", d["spec"]


def check_pods(r):
    for label, spec in pod_specs(r):
        where = f"{r.name}: {label}"
        psc = spec.get("securityContext", {})
        check(psc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot is not true")
        check(isinstance(psc.get("runAsUser"), int) and psc["runAsUser"] > 0, f"{where}: no numeric non-root runAsUser")
        check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccomp is not RuntimeDefault")
        check(spec.get("automountServiceAccountToken") is False, f"{where}: the service account token is mounted")
        # Service links would inject TOLLGATE_PORT, TOLLGATE_SERVICE_HOST... for a Service named tollgate,
        # which Tollgate would skip at every start with a warning each.
        check(spec.get("enableServiceLinks") is False, f"{where}: enableServiceLinks is not false")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c.get("securityContext", {})
            check(sc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}: privilege escalation allowed")
            check(sc.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}: root filesystem writable")
            check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{where}/{c['name']}: capabilities not dropped")
            check(c.get("resources", {}).get("requests"), f"{where}/{c['name']}: no resource requests")
            for m in c.get("volumeMounts", []):
                if "configMap" in volumes.get(m["name"], {}):
                    check("subPath" not in m, f"{where}/{c['name']}: ConfigMap volume {m['name']} mounted with subPath")
            for e in c.get("env", []):
                if SECRET_NAME.search(e["name"]):
                    check("value" not in e, f"{where}/{c['name']}: {e['name']} has an inline value, not a secretKeyRef")
                if "value" in e:
                    check(not re.fullmatch(r"-?[0-9.]+e[+-]?[0-9]+", str(e["value"])), f"{where}: {e['name']}={e['value']} in exponent form")


def check_tollgate(r):
    d = r.tollgate_deployment()
    spec = d["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "tollgate")
    if r.settings().get("TOLLGATE_GRPC_SERVER_USE_TLS") == "true":
        # The kubelet's gRPC probes speak plaintext: with TLS on gRPC they must use the HTTP port.
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            check("grpc" not in (c.get(kind) or {"grpc": 1}), f"{r.name}: {kind} is a plaintext gRPC probe on a TLS port")
        ready = c["readinessProbe"].get("httpGet", {})
        check(ready.get("path") == "/healthcheck", f"{r.name}: readiness is not /healthcheck: {ready}")
    else:
        probes = {}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = c.get(kind)
            if not check(p and "grpc" in p, f"{r.name}: {kind} missing or not a gRPC probe"):
                continue
            check(isinstance(p["grpc"].get("port"), int), f"{r.name}: {kind} port is not a number: {p['grpc'].get('port')!r}")
            probes[kind] = p["grpc"].get("service")
        check(probes.get("readinessProbe") == "ratelimit", f"{r.name}: readiness does not ask for service ratelimit")
        check(probes.get("livenessProbe") != "tollgate.store", f"{r.name}: liveness depends on the store")
        check(probes.get("livenessProbe") == "", f"{r.name}: liveness does not ask for service \"\"")
        check(probes.get("startupProbe") == "", f"{r.name}: startup does not ask for service \"\"")

    over_xds = r.settings().get("TOLLGATE_CONFIG_TYPE") == "GRPC_XDS_SOTW"
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == RULES_DIR]
    if over_xds:
        check(not mounts, f"{r.name}: rules mounted although they come over xDS")
    elif check(len(mounts) == 1, f"{r.name}: rules not mounted at {RULES_DIR}"):
        check("subPath" not in mounts[0], f"{r.name}: rules mounted with subPath (ConfigMap updates would not reach the pod)")
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[0]["name"])
        check("configMap" in volume, f"{r.name}: the rules volume is not a ConfigMap")

    annotations = d["spec"]["template"]["metadata"].get("annotations", {})
    check("checksum/settings" in annotations, f"{r.name}: no checksum/settings annotation")
    check(not any(k.startswith("checksum/") and k != "checksum/settings" for k in annotations),
          f"{r.name}: a checksum annotation other than settings (rules must hot-reload, not roll pods)")

    settings = r.settings()
    check(over_xds or settings.get("TOLLGATE_CONFIG_DIR") == RULES_DIR, f"{r.name}: TOLLGATE_CONFIG_DIR is not {RULES_DIR}")
    drain = settings.get("TOLLGATE_DRAIN_PERIOD", "0s")
    check(re.fullmatch(r"[0-9]+s", drain), f"{r.name}: TOLLGATE_DRAIN_PERIOD {drain!r}")
    check(spec["terminationGracePeriodSeconds"] > int(drain.rstrip("s")), f"{r.name}: grace period not above the drain period")
    check(spec.get("topologySpreadConstraints"), f"{r.name}: no topologySpreadConstraints")

    hpa = r.of("HorizontalPodAutoscaler")
    if hpa:
        check("replicas" not in d["spec"], f"{r.name}: replicas set although the HPA is on")
        check(hpa[0]["apiVersion"] == "autoscaling/v2", f"{r.name}: HPA is not autoscaling/v2")
    else:
        check("replicas" in d["spec"], f"{r.name}: no replicas and no HPA")
    for pdb in r.of("PodDisruptionBudget"):
        check("minAvailable" not in pdb["spec"], f"{r.name}: PDB uses minAvailable")

    services = r.of("Service")
    main = [s for s in services if s["spec"].get("clusterIP") != "None" and "redis" not in s["metadata"]["name"]]
    check(len(main) == 1, f"{r.name}: expected one Tollgate ClusterIP Service")
    for s in services:
        for p in s["spec"]["ports"]:
            if p["name"] == "grpc":
                check(p.get("appProtocol") == "grpc", f"{r.name}: Service {s['metadata']['name']} grpc port lacks appProtocol grpc")

    hook_jobs = r.hooks("Job")
    if r.settings().get("TOLLGATE_CONFIG_TYPE") == "GRPC_XDS_SOTW":
        check(not hook_jobs, f"{r.name}: a check-config Job although rules come over xDS")
    else:
        check(len(hook_jobs) == 1 and "pre-install" in hook_jobs[0]["metadata"]["annotations"]["helm.sh/hook"]
              and "pre-upgrade" in hook_jobs[0]["metadata"]["annotations"]["helm.sh/hook"],
              f"{r.name}: no pre-install/pre-upgrade check-config Job")
    if hook_jobs:
        args = hook_jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        check(args[:2] == ["check-config", RULES_DIR], f"{r.name}: the hook Job does not run check-config {RULES_DIR}")
    tests = r.hooks("Pod")
    if r.settings().get("TOLLGATE_GRPC_SERVER_USE_TLS") == "true":
        check(not tests, f"{r.name}: a plaintext helm test pod against a TLS gRPC port")
    else:
        check(tests and tests[0]["spec"]["containers"][0]["args"][0] == "healthcheck", f"{r.name}: no helm test pod")


def check_selectors(r):
    """Only the Deployment's own pods carry Tollgate's selector labels (else Services would route to a
    hook or test pod, and the ReplicaSet would adopt it)."""
    selector = r.tollgate_deployment()["spec"]["selector"]["matchLabels"]
    for d in r.docs:
        if d["kind"] == "Pod":
            labels = d["metadata"].get("labels", {})
        elif d["kind"] in ("Job", "Deployment") and d is not r.tollgate_deployment():
            labels = d["spec"]["template"]["metadata"].get("labels", {})
        else:
            continue
        check(not all(labels.get(k) == v for k, v in selector.items()),
              f"{r.name}: {d['kind']}/{d['metadata']['name']} carries Tollgate's selector labels")


def check_no_secrets_in_configmaps(r):
    for cm in r.of("ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            where = f"{r.name}: ConfigMap {cm['metadata']['name']} key {key}"
            check(not SECRET_NAME.search(key), f"{where} looks like a secret")
            check(not URL_CREDENTIALS.search(str(value)), f"{where} holds a URL with credentials")


def check_render(r):
    check_pods(r)
    check_tollgate(r)
    check_no_secrets_in_configmaps(r)
    check_selectors(r)


def helm_template(args, *extra, kube="1.33.0", api_versions=True):
    cmd = [args.helm, "template", "tollgate", args.chart, "-n", "rl", "--kube-version", kube, *extra]
    if api_versions:
        cmd += ["--api-versions", "monitoring.coreos.com/v1"]
    return subprocess.run(cmd, capture_output=True, text=True)


RENDERED_HERE = []


def rendered(args, name, *extra, **kw):
    RENDERED_HERE.append(name)
    result = helm_template(args, *extra, **kw)
    if not check(result.returncode == 0, f"{name}: helm template failed: {result.stderr.strip()}"):
        return None
    return Render(name, result.stdout)


def rules_check(args, render, expect_ok, quiet=False):
    """Writes the rules ConfigMap's files to a directory and runs `tollgate check-config` on it, with the
    hook Job's arguments and environment (so the chart's settings are validated too)."""
    rules = [c for c in render.of("ConfigMap") if c["metadata"]["name"].endswith("-rules")]
    if not check(len(rules) == 1, f"{render.name}: no rules ConfigMap"):
        return
    job = render.hooks("Job")[0]["spec"]["template"]["spec"]["containers"][0]
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in rules[0]["data"].items():
            pathlib.Path(tmp, name).write_text(text)
        # Only the Job's TOLLGATE_* variables: this runner's own must not change what is checked.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
        env.update({e["name"]: e["value"] for e in job.get("env", []) if "value" in e})
        command = [args.tollgate, *[tmp if a == RULES_DIR else a for a in job["args"]]]
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        output = (result.stdout + result.stderr).strip()
        if expect_ok:
            check(result.returncode == 0, f"{render.name}: check-config failed on the rendered rules: {output}")
            if not quiet:
                print(f"  {render.name}: check-config on the rendered rules: {output.replace(tmp, 'RULES')}")
        else:
            check(result.returncode != 0, f"{render.name}: check-config accepted a broken rule")
            check("broken.yaml" in output, f"{render.name}: check-config did not name the broken file: {output}")
            print(f"  {render.name}: check-config rejects the broken rule: {output.replace(tmp, 'RULES')}")


# Where Tollgate writes its metrics; every name a dashboard panel or an alert may use is read from them.
METRIC_SOURCES = ["src/observe/prometheus.rs", "src/observe/go_series.rs", "src/observe/text_format.rs",
                  "core/src/observe/metrics.rs", "src/observe/process.rs"]
METRIC_NAME = re.compile(r"(?:tollgate|ratelimit_service|process)_[a-z0-9_]*[a-z0-9]")
# The one series Prometheus writes for every target itself, and the labels it gives every sample (the
# Prometheus Operator adds namespace, pod, service, container and endpoint).
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


def exported_metrics(paths):
    """(series, labels) that Tollgate's /metrics can carry, read from the Rust source that writes it
    (tests excluded): every string literal that is a whole metric name or a `# TYPE name kind` header;
    the per-rule series, a literal prefix + `{suffix}` for each entry of RULE_SERIES; and for a histogram
    (`let name = "...";` whose next `# TYPE {name}` header says histogram) the suffixes its renderer
    writes (`{name}_bucket{...`) instead of the bare name, which is no series. Labels are every
    `label=\\"` written in a literal."""
    text = "".join(pathlib.Path(path).read_text().split("#[cfg(test)]")[0] for path in paths)
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', text)
    names = {lit for lit in literals if METRIC_NAME.fullmatch(lit)}
    for lit in literals:
        names |= {n for n in re.findall(r"# TYPE (\S+) \w+", lit) if METRIC_NAME.fullmatch(n)}
    rule_series = re.search(r"const RULE_SERIES\b[^=]*=\s*\[(.*?)\];", text, re.S)
    prefixes = [m.group(1) for m in (re.fullmatch(r"(\w+_)\{suffix\}", lit) for lit in literals) if m]
    check(rule_series and prefixes, f"{paths}: RULE_SERIES or the per-rule name prefix not found")
    if rule_series:
        names |= {p + s for p in prefixes for s in re.findall(r'"(\w+)"', rule_series.group(1))}
    suffixes = set(re.findall(r'"\{name\}(_[a-z]+)\{', text))
    check(suffixes == {"_bucket", "_sum", "_count"}, f"{paths}: histogram suffixes not found: {suffixes}")
    histograms = 0
    for m in re.finditer(r'let name = "(\w+)";', text):
        kind = re.search(r"# TYPE \{name\} (\w+)", text[m.end():])
        if kind and kind.group(1) == "histogram":
            histograms += 1
            names.discard(m.group(1))
            names |= {m.group(1) + s for s in suffixes}
    check(histograms > 0, f"{paths}: no histogram found")
    labels = set(re.findall(r'([a-z_][a-z0-9_]*)=\\"', text))
    return names, labels


PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
PROMQL_SELECTOR = re.compile(r'(?<![\w.$:])([A-Za-z_:][\w:]*)?\s*\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}')
PROMQL_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                   "group_left", "group_right", "inf", "nan"}


def promql_parts(expr):
    """The vector selectors of a PromQL expression, as (metric name, matchers text or None), and the label
    names it mentions (in matchers and in by/without/on/ignoring/group_* lists). Functions are names
    followed by `(`; strings, ranges and Grafana's `$variables` are skipped. Enough for the expressions
    of this chart, which it checks, not a PromQL parser."""
    selectors, labels = [], set()
    for m in PROMQL_SELECTOR.finditer(expr):
        body = m.group(2)
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", PROMQL_STRING.sub('""', body)))
        selectors.append((m.group(1), body.strip()))
    text = PROMQL_STRING.sub('""', PROMQL_SELECTOR.sub(" ", expr))
    text = re.sub(r"\[[^\]]*\]", " ", text)
    for body in PROMQL_GROUPING.findall(text):
        labels |= {name.strip() for name in body.split(",") if name.strip()}
    text = PROMQL_GROUPING.sub(" ", text)
    for m in re.finditer(r"(?<![\w.$:])([A-Za-z_:][\w:]*)\b(?!\s*\()", text):
        if m.group(1) not in PROMQL_KEYWORDS:
            selectors.append((m.group(1), None))
    return selectors, labels


def check_promql_reader():
    """promql_parts on an expression with every construct the chart uses, so a broken reader cannot pass
    every expression by finding nothing in it."""
    selectors, labels = promql_parts(
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="x", le!~"1}"}[$__rate_interval]))) > 2e-2'
        ' and on (job) b offset 5m or absent(up) / time()')
    check(sorted(selectors, key=str) == sorted([("a_bucket", 'job="x", le!~"1}"'), ("b", None), ("up", None)], key=str)
          and labels == {"job", "le"}, f"the PromQL reader is broken: {selectors} {labels}")


class PromqlNames:
    """Collects the series and labels that expressions use but Tollgate does not export, to report each
    name once with everywhere it is used."""

    def __init__(self, exported):
        self.series, self.labels = exported
        self.unknown_series = collections.defaultdict(set)
        self.unknown_labels = collections.defaultdict(set)

    def check(self, where, expr, scope=()):
        """`expr` parses, names at least one series, only series and labels Tollgate (or Prometheus)
        writes, and every vector selector in it carries the `scope` matchers."""
        stripped = PROMQL_STRING.sub('""', expr)
        check(all(stripped.count(a) == stripped.count(b) for a, b in ("()", "[]", "{}")),
              f"{where}: unbalanced brackets in {expr!r}")
        selectors, labels = promql_parts(expr)
        check(selectors, f"{where}: no series in {expr!r}")
        for name, matchers in selectors:
            if name and name not in self.series and name not in PROMETHEUS_SERIES:
                self.unknown_series[name].add(where)
            compact = re.sub(r"\s", "", matchers or "")
            for matcher in scope:
                check(re.sub(r"\s", "", matcher) in compact, f"{where}: {name}{{{matchers or ''}}} lacks {matcher}")
        for label in labels - self.labels - TARGET_LABELS:
            self.unknown_labels[label].add(where)

    def report(self):
        for name, wheres in sorted(self.unknown_series.items()):
            check(False, f"{name} is not a series Tollgate writes ({', '.join(METRIC_SOURCES)}); used by: "
                  + "; ".join(sorted(wheres)))
        for label, wheres in sorted(self.unknown_labels.items()):
            check(False, f"label {label} is not one Tollgate writes ({', '.join(METRIC_SOURCES)}) nor a target "
                  "label; used by: " + "; ".join(sorted(wheres)))


ALERTS = {"TollgateDown", "TollgateStoreDown", "TollgateFailureModeHigh", "TollgateConfigLoadErrors",
          "TollgateLatencySLO"}
# The fields of a rule in the PrometheusRule CRD (an unknown one is refused by the API server).
RULE_FIELDS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
PROM_DURATION = re.compile(r"0|([0-9]+(ms|s|m|h|d|w|y))+")


def check_prometheus_rule(r, promql, scope):
    """The one PrometheusRule of a render: the CRD's shape, every alert with a duration, a severity, a
    summary and a description, and PromQL scoped to the release. Returns {alert name: rule}."""
    found = r.of("PrometheusRule")
    if not check(len(found) == 1, f"{r.name}: expected one PrometheusRule, got {len(found)}"):
        return {}
    resource = found[0]
    check(resource["apiVersion"] == "monitoring.coreos.com/v1", f"{r.name}: PrometheusRule apiVersion {resource['apiVersion']}")
    groups = resource["spec"].get("groups") or []
    check(set(resource["spec"]) == {"groups"} and groups, f"{r.name}: PrometheusRule spec is not a list of groups")
    check(len({g.get("name") for g in groups}) == len(groups), f"{r.name}: PrometheusRule group names repeat")
    alerts = {}
    for group in groups:
        check(group.get("name") and group.get("rules"), f"{r.name}: PrometheusRule group without a name or rules")
        for rule in group.get("rules") or []:
            name = rule.get("alert")
            where = f"{r.name}: alert {name}"
            check(isinstance(name, str) and re.fullmatch(r"[A-Z][A-Za-z0-9]*", name), f"{where}: not a CamelCase alert name")
            check(name not in alerts, f"{where}: defined twice")
            alerts[name] = rule
            check(set(rule) <= RULE_FIELDS, f"{where}: unknown fields {set(rule) - RULE_FIELDS}")
            check(PROM_DURATION.fullmatch(str(rule.get("for", "0"))), f"{where}: for {rule.get('for')!r} is not a duration")
            labels, notes = rule.get("labels") or {}, rule.get("annotations") or {}
            check(all(isinstance(v, str) for v in {**labels, **notes}.values()), f"{where}: a label or annotation is not a string")
            check(labels.get("severity"), f"{where}: no severity label")
            check(notes.get("summary") and notes.get("description"), f"{where}: no summary or description")
            if check(isinstance(rule.get("expr"), str), f"{where}: expr is not a string"):
                promql.check(f"alert {name}", rule["expr"], scope)
    return alerts


DASHBOARD_FILE = "dashboards/tollgate.json"
DATASOURCE = "${datasource}"
DASHBOARD_SCOPE = ('namespace="$namespace"', 'job="$job"', 'instance=~"$instance"')
# Kubernetes refuses objects over 1 MiB; a ConfigMap's data must stay below it.
CONFIGMAP_MAX_BYTES = 1 << 20


def dashboard_panels(panels):
    """Every panel, the panels of collapsed rows included."""
    for panel in panels:
        yield panel
        yield from dashboard_panels(panel.get("panels") or [])


def check_dashboard(r, args, promql, namespace="rl", label=("grafana_dashboard", "1")):
    """The dashboard ConfigMap of a render: the sidecar's label, the chart's JSON file as it is, and a
    dashboard whose every panel queries Tollgate's series through the data source variable, scoped by the
    namespace, job and instance variables."""
    maps = [c for c in r.of("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    if not check(len(maps) == 1, f"{r.name}: expected one dashboard ConfigMap, got {len(maps)}"):
        return
    meta, data = maps[0]["metadata"], maps[0].get("data") or {}
    check(meta["namespace"] == namespace, f"{r.name}: dashboard ConfigMap in namespace {meta['namespace']}, not {namespace}")
    check(meta["labels"].get(label[0]) == label[1], f"{r.name}: dashboard ConfigMap lacks the label {label[0]}={label[1]}")
    if not check(list(data) == ["tollgate.json"], f"{r.name}: dashboard ConfigMap keys {list(data)}"):
        return
    text = data["tollgate.json"]
    check(text == pathlib.Path(args.chart, DASHBOARD_FILE).read_text().rstrip("\n"),
          f"{r.name}: the dashboard ConfigMap does not hold {DASHBOARD_FILE} as it is")
    check(len(text.encode()) < CONFIGMAP_MAX_BYTES, f"{r.name}: the dashboard is over 1 MiB")
    try:
        dashboard = json.loads(text)
    except ValueError as error:
        check(False, f"{r.name}: the dashboard is not JSON: {error}")
        return
    check(dashboard.get("uid") and dashboard.get("title"), f"{r.name}: the dashboard has no uid or title")
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    source = variables.get("datasource", {})
    check(source.get("type") == "datasource" and source.get("query") == "prometheus",
          f"{r.name}: the dashboard has no Prometheus data source variable")
    for name in ("namespace", "job", "instance"):
        variable = variables.get(name)
        if not check(variable and variable.get("type") == "query", f"{r.name}: the dashboard has no {name} variable"):
            continue
        check(variable.get("datasource", {}).get("uid") == DATASOURCE, f"{r.name}: variable {name} does not use {DATASOURCE}")
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", query or "")
        if check(m, f"{r.name}: variable {name} is not label_values(series, label): {query!r}"):
            promql.check(f"dashboard variable {name}", m.group(1))
            check(m.group(2) == name, f"{r.name}: variable {name} lists label {m.group(2)}")
    panels = list(dashboard_panels(dashboard.get("panels") or []))
    ids = [p.get("id") for p in panels]
    check(len(set(ids)) == len(ids) and None not in ids, f"{r.name}: dashboard panel ids missing or repeated")
    queried = 0
    for panel in panels:
        where = f"dashboard panel {panel.get('title')!r}"
        grid = panel.get("gridPos") or {}
        check(all(isinstance(grid.get(k), int) for k in "xywh") and grid["x"] + grid["w"] <= 24,
              f"{r.name}: {where}: gridPos {grid}")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        check(targets, f"{r.name}: {where} has no target")
        check(panel.get("datasource", {}).get("uid") == DATASOURCE, f"{r.name}: {where} does not use {DATASOURCE}")
        for target in targets:
            check(target.get("datasource", {}).get("uid") == DATASOURCE, f"{r.name}: {where} target {target.get('refId')} does not use {DATASOURCE}")
            if check(target.get("expr"), f"{r.name}: {where} target {target.get('refId')} has no expr"):
                promql.check(where, target["expr"], DASHBOARD_SCOPE)
                queried += 1
    rows = sum(p.get("type") == "row" for p in panels)
    print(f"  {r.name}: dashboard {dashboard.get('title')!r}: {len(panels) - rows} panels in {rows} rows, {queried} queries")


# Values that must fail the render: (name, values, text the error must contain).
MUST_FAIL = [
    ("tls-memory", "redis: {mode: memory, tls: true}\n", "redis.tls"),
    ("tls-sentinel", "redis: {mode: sentinel, sentinelMaster: m, addresses: ['s:26379'], tls: true}\n", "redis.tls"),
    ("memory-with-url", "redis: {mode: memory, url: 'r:6379'}\n", "redis.mode is memory"),
    ("single-without-url", "redis: {mode: single}\n", "needs redis.url"),
    ("sentinel-without-master", "redis: {mode: sentinel, addresses: ['s:26379']}\n", "sentinelMaster"),
    ("url-with-password", "redis: {mode: single, url: 'redis://:hunter2@r:6379'}\n", "Secret"),
    ("secret-in-settings", "settings: {REDIS_AUTH: hunter2}\n", "REDIS_AUTH"),
    ("hash-key-in-settings", "settings: {HASH_KEY: hunter2}\n", "HASH_KEY"),
    ("refund-key-in-settings", "settings: {REFUND_KEY: hunter2}\n", "REFUND_KEY"),
    ("worker-threads-in-settings", "settings: {WORKER_THREADS: 2}\n", "WORKER_THREADS"),
    ("worker-threads-zero", "workerThreads: 0\n", "workerThreads"),
    ("grace-below-drain", "drainPeriodSeconds: 30\nterminationGracePeriodSeconds: 30\n", "drainPeriodSeconds"),
    ("duplicate-domain", "domains: [{domain: a}, {domain: a}]\n", "two entries for domain"),
    ("domain-without-name", "domains: [{descriptors: []}]\n", "domain"),
    ("root-pod", "podSecurityContext: {runAsNonRoot: false}\n", "runAsNonRoot"),
    ("unknown-mode", "redis: {mode: memcache}\n", "mode"),
    ("rule-without-scrape", "prometheusRule: {enabled: true}\n", "prometheusRule.selector"),
    ("rule-quantile-one", "prometheusRule: {alerts: {latencySlo: {quantile: 1}}}\n", "/latencySlo/quantile"),
    ("rule-bad-duration", "prometheusRule: {alerts: {storeDown: {for: 2 minutes}}}\n", "/storeDown/for"),
]


def must_fail(args, name, values_text, expected):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(values_text)
        f.flush()
        result = helm_template(args, "-f", f.name)
    check(result.returncode != 0, f"must-fail {name}: the render succeeded")
    check(expected in result.stderr, f"must-fail {name}: expected {expected!r} in: {result.stderr.strip()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--helm", required=True)
    parser.add_argument("--chart", required=True)
    parser.add_argument("--tollgate", required=True)
    parser.add_argument("--renders", required=True, help="directory of render-*.yaml from check-chart.sh")
    parser.add_argument("--kube-versions", nargs="+", required=True)
    parser.add_argument("--metric-sources", nargs="+", default=METRIC_SOURCES,
                        help="the Rust files that write /metrics (the series PromQL may name are read from them)")
    args = parser.parse_args()
    check_promql_reader()
    promql = PromqlNames(exported_metrics(args.metric_sources))

    # 1. Every ci/*.yaml render made by check-chart.sh.
    files = sorted(pathlib.Path(args.renders).glob("render-*.yaml"))
    check(len(files) == len(list(pathlib.Path(args.chart, "ci").glob("*.yaml"))) * len(args.kube_versions),
          "not every ci/*.yaml was rendered for every Kubernetes version")
    for path in files:
        render = Render(path.stem, path.read_text())
        check_render(render)
        # The hook's check-config, as the Job would run it, on every render that carries its own rules.
        if any(c["metadata"]["name"].endswith("-rules") for c in render.of("ConfigMap")):
            rules_check(args, render, expect_ok=True, quiet=True)

    # 2. The defaults: a working single replica on the embedded store; everything optional is off.
    default = rendered(args, "defaults")
    if default:
        check_render(default)
        for kind in ("PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor", "NetworkPolicy", "PrometheusRule"):
            check(not default.of(kind), f"defaults: {kind} rendered although off by default")
        check(not [c for c in default.of("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")],
              "defaults: the dashboard ConfigMap rendered although off by default")
        check("REDIS_URL" not in default.settings(), "defaults: REDIS_URL set on the embedded store")
        check("TOLLGATE_WORKER_THREADS" not in default.settings(), "defaults: TOLLGATE_WORKER_THREADS set (null keeps Tollgate's default)")
        check("TOLLGATE_MEMORY_MAX_KEYS" not in default.settings(), "defaults: TOLLGATE_MEMORY_MAX_KEYS set without a memory limit")
        check(default.tollgate_deployment()["spec"]["replicas"] == 1, "defaults: replicas is not 1")
        fleet = default.settings().get("TOLLGATE_FLEET_SIZE")
        check(fleet == "1", f"defaults: TOLLGATE_FLEET_SIZE={fleet!r}, not replicaCount (1)")
        # The refund key: a Secret of the chart's, mounted as the file TOLLGATE_REFUND_KEY_FILE names.
        secrets = [s for s in default.of("Secret") if s["metadata"]["name"].endswith("-refund-key")]
        check(len(secrets) == 1 and len(base64.b64decode(secrets[0]["data"]["refund-key"])) >= 32,
              "defaults: no refund key Secret of at least 32 bytes")
        volumes = {v["name"]: v for v in default.tollgate_deployment()["spec"]["template"]["spec"]["volumes"]}
        check(volumes.get("refund-key", {}).get("secret", {}).get("secretName") == secrets[0]["metadata"]["name"]
              if secrets else False, "defaults: the refund key Secret is not mounted")
        check(default.settings().get("TOLLGATE_REFUND_KEY_FILE") == "/etc/tollgate/refund/refund-key",
              "defaults: TOLLGATE_REFUND_KEY_FILE does not name the mounted key")
        ports = [p["name"] for s in default.of("Service") for p in s["spec"]["ports"]]
        check("debug" not in ports, "defaults: the debug port (/rlconfig, /top) is on a Service")
        rules_check(args, default, expect_ok=True)
        # The default domains are examples/config/api.yaml; keep them from drifting apart.
        values = yaml.safe_load(pathlib.Path(args.chart, "values.yaml").read_text())
        example = yaml.safe_load(pathlib.Path("examples/config/api.yaml").read_text())
        check(values["domains"] == [example], "defaults: values.yaml domains differ from examples/config/api.yaml")

    # 3. The monitoring shape: everything on, and the ServiceMonitor only when the API exists.
    monitoring = rendered(args, "monitoring", "-f", f"{args.chart}/ci/monitoring-values.yaml")
    if monitoring:
        pdb = monitoring.of("PodDisruptionBudget")
        check(len(pdb) == 1 and pdb[0]["spec"].get("maxUnavailable") == 1, "monitoring: PDB is not maxUnavailable 1")
        check(len(monitoring.of("ServiceMonitor")) == 1, "monitoring: no ServiceMonitor")
        check(monitoring.of("HorizontalPodAutoscaler"), "monitoring: no HPA")
        # 512Mi limit: (512 - 64) MiB at 300 bytes a key.
        keys = monitoring.settings().get("TOLLGATE_MEMORY_MAX_KEYS")
        check(keys == str((512 - 64) * 1048576 // 300), f"monitoring: TOLLGATE_MEMORY_MAX_KEYS={keys!r} for a 512Mi limit")
        fleet = monitoring.settings().get("TOLLGATE_FLEET_SIZE")
        check(fleet == "6", f"monitoring: TOLLGATE_FLEET_SIZE={fleet!r}, not the HPA's maxReplicas (6)")
        threads = monitoring.settings().get("TOLLGATE_WORKER_THREADS")
        check(threads == "2", f"monitoring: workerThreads 2 rendered as TOLLGATE_WORKER_THREADS={threads!r}")
        check(len(monitoring.of("NetworkPolicy")) == 2, "monitoring: expected NetworkPolicies for Tollgate and the dev Redis")
        sm = monitoring.of("ServiceMonitor")
        if sm:
            check(sm[0]["spec"]["endpoints"][0]["port"] == "http", "monitoring: ServiceMonitor does not scrape the http port")
            # The Prometheus Operator names the job after the scraped Service: the alerts select it.
            check(sm[0]["spec"]["selector"]["matchLabels"] == monitoring.tollgate_deployment()["spec"]["selector"]["matchLabels"]
                  and [s for s in monitoring.of("Service") if s["metadata"]["name"] == "tollgate"
                       and any(p["name"] == "http" for p in s["spec"]["ports"])],
                  "monitoring: the ServiceMonitor's job would not be the Service tollgate")
        alerts = check_prometheus_rule(monitoring, promql, ('job="tollgate"', 'namespace="rl"'))
        check(set(alerts) == ALERTS, f"monitoring: alerts {sorted(alerts)}, expected {sorted(ALERTS)}")
        pr = monitoring.of("PrometheusRule")
        check(pr and pr[0]["metadata"]["labels"].get("release") == "prometheus", "monitoring: PrometheusRule lacks prometheusRule.labels")
        check(all(a["labels"].get("team") == "edge" for a in alerts.values()), "monitoring: an alert lacks prometheusRule.alertLabels")
        if set(alerts) == ALERTS:
            check(alerts["TollgateConfigLoadErrors"]["labels"]["severity"] == "info", "monitoring: configLoadErrors.severity not applied")
            check(alerts["TollgateStoreDown"]["labels"]["severity"] == "critical", "monitoring: storeDown is not critical by default")
            check(re.search(r"histogram_quantile\(0\.99,.*\)\s*> 0\.015$", alerts["TollgateLatencySLO"]["expr"], re.S),
                  "monitoring: TollgateLatencySLO is not the 0.99 quantile above latencySlo.thresholdSeconds 0.015")
            check(alerts["TollgateFailureModeHigh"]["expr"].endswith("> 1"), "monitoring: TollgateFailureModeHigh threshold is not 1 (%)")
            check("absent(up{" in alerts["TollgateDown"]["expr"], "monitoring: TollgateDown does not fire without a target")
        check_dashboard(monitoring, args, promql)
        check(monitoring.of("ConfigMap") and all(c["metadata"].get("annotations", {}).get("grafana_folder") == "Tollgate"
              for c in monitoring.of("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")),
              "monitoring: the dashboard ConfigMap lacks grafanaDashboard.annotations")
    # Scraped by something else: the alerts use prometheusRule.selector; one alert off; the dashboard for a
    # sidecar with its own label, in Grafana's namespace.
    selected = rendered(args, "prometheus-rule-selector", "--set", "prometheusRule.enabled=true",
                        "--set-json", "prometheusRule.selector=" + json.dumps('job="edge-rl",namespace="edge"'),
                        "--set", "prometheusRule.alerts.down.enabled=false",
                        "--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=monitoring",
                        "--set", "grafanaDashboard.label=dashboards", "--set", "grafanaDashboard.labelValue=tollgate")
    if selected:
        alerts = check_prometheus_rule(selected, promql, ('job="edge-rl"', 'namespace="edge"'))
        check(set(alerts) == ALERTS - {"TollgateDown"}, f"prometheus-rule-selector: alerts {sorted(alerts)}")
        latency = alerts.get("TollgateLatencySLO", {}).get("expr", "")
        check(re.search(r"histogram_quantile\(0\.99,.*\)\s*> 0\.02$", latency, re.S),
              f"prometheus-rule-selector: the default latency alert is not p99 above 20 ms: {latency}")
        check_dashboard(selected, args, promql, namespace="monitoring", label=("dashboards", "tollgate"))
    # Envoy Gateway's shape: gRPC mTLS from the Secret, rules over xDS with TLS to the controller.
    eg = rendered(args, "envoy-gateway", "-f", f"{args.chart}/ci/envoy-gateway-values.yaml")
    if eg:
        env = eg.settings()
        expected = {
            "TOLLGATE_GRPC_SERVER_USE_TLS": "true",
            "TOLLGATE_GRPC_SERVER_TLS_CERT": "/etc/tollgate/grpc-tls/tls.crt",
            "TOLLGATE_GRPC_CLIENT_TLS_CACERT": "/etc/tollgate/grpc-tls/ca.crt",
            "TOLLGATE_CONFIG_TYPE": "GRPC_XDS_SOTW",
            "TOLLGATE_CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway.envoy-gateway-system:18001",
            "TOLLGATE_CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
            "TOLLGATE_FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
        }
        for name, value in expected.items():
            check(env.get(name) == value, f"envoy-gateway: {name}={env.get(name)!r}, expected {value!r}")
        check("TOLLGATE_CONFIG_DIR" not in env, "envoy-gateway: a rules directory is set although rules come over xDS")
        volumes = {v["name"]: v for v in eg.tollgate_deployment()["spec"]["template"]["spec"]["volumes"]}
        check(volumes.get("grpc-tls", {}).get("secret", {}).get("secretName") == "envoy-rate-limit",
              "envoy-gateway: the gRPC TLS Secret is not mounted")
    must_fail(args, "tls-without-secret", "grpcTls:\n  enabled: true\n", "grpcTls.secretName")
    must_fail(args, "xds-without-server", "xds:\n  enabled: true\n", "xds.serverUrl")
    # Readiness that requires the store: gRPC service tollgate.store, or /readyz with TLS; liveness never.
    for name, extra, kind, expected in [
        ("ready-with-store", [], "grpc", "tollgate.store"),
        ("ready-with-store-tls", ["--set", "grpcTls.enabled=true", "--set", "grpcTls.secretName=rl-tls"], "httpGet", "/readyz"),
    ]:
        render = rendered(args, name, "--set", "probes.readinessRequiresStore=true", *extra)
        if render:
            c = next(c for c in render.tollgate_deployment()["spec"]["template"]["spec"]["containers"] if c["name"] == "tollgate")
            probe = c["readinessProbe"].get(kind, {})
            check(probe.get("service", probe.get("path")) == expected, f"{name}: readiness is {probe}, expected {expected}")
            check(c["livenessProbe"] != c["readinessProbe"], f"{name}: liveness follows the store")
    # A NetworkPolicy with no peers named: gRPC from anywhere, HTTP and debug from the namespace only.
    policy = rendered(args, "network-policy", "--set", "networkPolicy.enabled=true")
    if policy:
        rules = policy.of("NetworkPolicy")[0]["spec"]["ingress"]
        admin = [r for r in rules if any(p["port"] == 8080 for p in r["ports"])]
        check(len(admin) == 1 and admin[0].get("from") == [{"podSelector": {}}],
              f"network-policy: the HTTP and debug ports are open beyond the namespace: {admin}")
    no_crd = rendered(args, "monitoring-without-crd", "-f", f"{args.chart}/ci/monitoring-values.yaml", api_versions=False)
    if no_crd:
        check(not no_crd.of("ServiceMonitor"), "monitoring-without-crd: ServiceMonitor rendered without monitoring.coreos.com/v1")
        check(not no_crd.of("PrometheusRule"), "monitoring-without-crd: PrometheusRule rendered without monitoring.coreos.com/v1")
        check([c for c in no_crd.of("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")],
              "monitoring-without-crd: the dashboard ConfigMap (no CRD needed) is missing")

    # 4. Redis wiring: the password only through a secretKeyRef.
    single = rendered(args, "redis-single", "-f", f"{args.chart}/ci/redis-single-values.yaml")
    if single:
        settings = single.settings()
        check(settings.get("REDIS_TYPE") == "single" and settings.get("REDIS_URL"), "redis-single: REDIS_TYPE/REDIS_URL not set")
        env = {e["name"]: e for e in single.tollgate_deployment()["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        auth = env.get("REDIS_AUTH", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check(auth.get("name") == "tollgate-redis" and auth.get("key") == "password", "redis-single: REDIS_AUTH not from the Secret")
    cluster = rendered(args, "redis-cluster", "-f", f"{args.chart}/ci/redis-cluster-values.yaml")
    if cluster:
        settings = cluster.settings()
        check(settings.get("REDIS_TLS") == "true", "redis-cluster: REDIS_TLS not set")
        check(settings.get("REDIS_TLS_CACERT") == "/etc/tollgate/redis-tls/ca.crt", "redis-cluster: REDIS_TLS_CACERT not the mounted CA")
        pod = cluster.tollgate_deployment()["spec"]["template"]["spec"]
        mounts = {m["name"]: m for m in pod["containers"][0].get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        check(mounts.get("redis-tls", {}).get("readOnly") is True, "redis-cluster: the Redis CA is not mounted read-only")
        check(volumes.get("redis-tls", {}).get("secret", {}).get("secretName") == "redis-cluster-ca", "redis-cluster: the CA volume is not the Secret")
    sentinel = rendered(args, "redis-sentinel", "-f", f"{args.chart}/ci/redis-sentinel-values.yaml")
    if sentinel:
        url = sentinel.settings().get("REDIS_URL", "")
        check(url.startswith("mymaster,") and url.count(",") == 3, f"redis-sentinel: REDIS_URL {url!r}")
        check(not [c for c in sentinel.of("ConfigMap") if c["metadata"]["name"].endswith("-rules")],
              "redis-sentinel: a rules ConfigMap rendered although existingConfigMap is set")
        volume = sentinel.tollgate_deployment()["spec"]["template"]["spec"]["volumes"][0]
        check(volume["configMap"]["name"] == "my-ratelimit-rules", "redis-sentinel: existingConfigMap not mounted")

    # 5. A broken rule renders (the chart cannot know Tollgate's rules) but check-config rejects it, naming
    #    the file: the hook Job runs exactly this before install and upgrade.
    broken = rendered(args, "broken-rule", "--set-json",
                      'domains=[{"domain":"broken","descriptors":[{"key":"k","ratelimit":{"unit":"second"}}]}]')
    if broken:
        rules_check(args, broken, expect_ok=False)

    # 6. Values that must fail the render, with a message that says why.
    for name, values_text, expected in MUST_FAIL:
        must_fail(args, name, values_text, expected)

    promql.report()
    checked = len(files) + len(RENDERED_HERE)
    if failures:
        for f in failures:
            print(f"FAIL {f}", file=sys.stderr)
        print(f"chart assertions: {len(failures)} failed", file=sys.stderr)
        return 1
    print(f"chart assertions: {checked} renders and {len(MUST_FAIL)} must-fail values checked, all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
