{{/* Chart name. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: RELEASE-tollgate, truncated to the 63 characters of a DNS label. */}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A name derived from the full name with a suffix, kept within 63 characters. */}}
{{- define "tollgate.suffixed" -}}
{{- $base := include "tollgate.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base .suffix }}
{{- end }}

{{- define "tollgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ include "tollgate.chart" . }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tollgate
{{- end }}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Tollgate image: digest wins over tag; the tag defaults to appVersion. */}}
{{- define "tollgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the rules files. */}}
{{- define "tollgate.rulesConfigMap" -}}
{{- if .Values.existingConfigMap }}
{{- .Values.existingConfigMap }}
{{- else }}
{{- include "tollgate.suffixed" (dict "root" . "suffix" "rules") }}
{{- end }}
{{- end }}

{{- define "tollgate.redisDevName" -}}
{{- include "tollgate.suffixed" (dict "root" . "suffix" "redis") }}
{{- end }}

{{/* Where rules are mounted; also TOLLGATE_CONFIG_DIR (the image's default). */}}
{{- define "tollgate.rulesDir" -}}
/etc/tollgate/rules
{{- end }}

{{/*
A value as an environment variable string. Helm reads numbers from values files as float64, which would
print 4194304 as 4.194304e+06: whole numbers are printed as integers.
*/}}
{{- define "tollgate.envString" -}}
{{- if kindIs "float64" . }}
{{- if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* Where the Redis CA Secret is mounted. */}}
{{/*
The embedded store's key cap from the container's memory limit, when there is one: 300 bytes a key
(measured under churn, with the table's slack) after 64 MiB for everything else, at least 10,000.
Empty without a limit (Tollgate's default, 640,000 keys, fits 256 MiB).
*/}}
{{- define "tollgate.memoryMaxKeys" -}}
{{- $limit := toString (((.Values.resources).limits).memory | default "") }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "K" 1000 "M" 1000000 "G" 1000000000 }}
{{- $bytes := 0 }}
{{- range $suffix, $factor := $units }}
{{- if and (eq $bytes 0) (hasSuffix $suffix $limit) (regexMatch "^[0-9]+$" (trimSuffix $suffix $limit)) }}
{{- $bytes = mul (trimSuffix $suffix $limit | int64) $factor }}
{{- end }}
{{- end }}
{{- if and (eq $bytes 0) (regexMatch "^[0-9]+$" $limit) }}
{{- $bytes = $limit | int64 }}
{{- end }}
{{- if gt $bytes 0 }}
{{- max 10000 (div (sub $bytes 67108864) 300) | toString }}
{{- end }}
{{- end }}

{{/* Where the refund key Secret is mounted. */}}
{{- define "tollgate.refundKeyDir" -}}
/etc/tollgate/refund
{{- end }}

{{/* The Secret holding the refund key(s): the operator's, or the one the chart creates. */}}
{{- define "tollgate.refundKeySecret" -}}
{{- .Values.refundKey.existingSecret | default (include "tollgate.suffixed" (dict "root" . "suffix" "refund-key")) }}
{{- end }}

{{- define "tollgate.redisTlsDir" -}}
/etc/tollgate/redis-tls
{{- end }}

{{/*
REDIS_TYPE and REDIS_URL for redis.mode, as YAML (empty for the embedded store). Fails on inconsistent
values, so a mistake shows at `helm install` instead of as a crash-looping pod.
*/}}
{{- define "tollgate.redisEnv" -}}
{{- $r := .Values.redis }}
{{- if and $r.tls (or (eq $r.mode "memory") (eq $r.mode "sentinel") $r.dev.enabled) }}
{{- fail "redis.tls needs an external Redis in mode single or cluster (Tollgate does not speak TLS to Sentinel, and the dev Redis has no TLS)" }}
{{- end }}
{{- if and $r.url (contains "@" $r.url) }}
{{- fail "redis.url must not carry credentials: put the password in a Secret and set redis.existingSecret" }}
{{- end }}
{{- if eq $r.mode "memory" }}
{{- if or $r.url $r.addresses $r.dev.enabled }}
{{- fail "redis.mode is memory (the embedded store), but redis.url, redis.addresses or redis.dev.enabled is set: set redis.mode to single, sentinel or cluster" }}
{{- end }}
{{- else if eq $r.mode "single" }}
{{- $url := $r.url }}
{{- if $r.dev.enabled }}
{{- if $r.url }}
{{- fail "redis.dev.enabled provides the Redis: leave redis.url empty" }}
{{- end }}
{{- $url = printf "%s:6379" (include "tollgate.redisDevName" .) }}
{{- end }}
{{- if not $url }}
{{- fail "redis.mode single needs redis.url (host:port) or redis.dev.enabled=true" }}
{{- end }}
{{- if $r.addresses }}
{{- fail "redis.mode single takes redis.url, not redis.addresses" }}
{{- end }}
REDIS_TYPE: single
REDIS_URL: {{ $url | quote }}
{{- else if eq $r.mode "sentinel" }}
{{- if or (not $r.sentinelMaster) (not $r.addresses) }}
{{- fail "redis.mode sentinel needs redis.sentinelMaster and redis.addresses (the sentinels, host:port)" }}
{{- end }}
{{- if or $r.url $r.dev.enabled }}
{{- fail "redis.mode sentinel takes redis.sentinelMaster and redis.addresses, not redis.url or redis.dev" }}
{{- end }}
REDIS_TYPE: sentinel
REDIS_URL: {{ prepend $r.addresses $r.sentinelMaster | join "," | quote }}
{{- else if eq $r.mode "cluster" }}
{{- if not $r.addresses }}
{{- fail "redis.mode cluster needs redis.addresses (seed nodes, host:port)" }}
{{- end }}
{{- if or $r.url $r.dev.enabled }}
{{- fail "redis.mode cluster takes redis.addresses, not redis.url or redis.dev" }}
{{- end }}
REDIS_TYPE: cluster
REDIS_URL: {{ join "," $r.addresses | quote }}
{{- end }}
{{- if $r.tls }}
REDIS_TLS: "true"
{{- if $r.tlsCaSecret }}
REDIS_TLS_CACERT: {{ printf "%s/%s" (include "tollgate.redisTlsDir" .) $r.tlsCaKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Every non-secret setting as environment variables (YAML map). Shared by the settings ConfigMap and the
check-config hook, so the hook validates the settings the pods will run with.
*/}}
{{- define "tollgate.settingsEnv" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.drainPeriodSeconds) }}
{{- fail "terminationGracePeriodSeconds must be larger than drainPeriodSeconds" }}
{{- end }}
{{- $env := dict
  "TOLLGATE_CONFIG_DIR" (include "tollgate.rulesDir" .)
  "TOLLGATE_GRPC_ADDR" (printf "0.0.0.0:%d" (int .Values.ports.grpc))
  "TOLLGATE_HTTP_ADDR" (printf "0.0.0.0:%d" (int .Values.ports.http))
  "TOLLGATE_DEBUG_ADDR" (printf "0.0.0.0:%d" (int .Values.ports.debug))
  "TOLLGATE_DRAIN_PERIOD" (printf "%ds" (int .Values.drainPeriodSeconds))
  "TOLLGATE_REFUND_KEY_FILE" (printf "%s/%s" (include "tollgate.refundKeyDir" .) .Values.refundKey.key) }}
{{- if .Values.xds.enabled }}
{{- $_ := unset $env "TOLLGATE_CONFIG_DIR" }}
{{- end }}
{{- with include "tollgate.memoryMaxKeys" . }}
{{- $_ := set $env "TOLLGATE_MEMORY_MAX_KEYS" . }}
{{- end }}
{{- /* failure_mode: local counts limit / fleet size per pod; the HPA's maximum errs on the strict side */}}
{{- $fleet := ternary .Values.autoscaling.maxReplicas .Values.replicaCount .Values.autoscaling.enabled }}
{{- $_ := set $env "TOLLGATE_FLEET_SIZE" (printf "%d" (int $fleet)) }}
{{- with .Values.workerThreads }}
{{- $_ := set $env "TOLLGATE_WORKER_THREADS" (include "tollgate.envString" .) }}
{{- end }}
{{- $env = merge $env (fromYaml (include "tollgate.redisEnv" .)) }}
{{- $env = merge $env (fromYaml (include "tollgate.grpcTlsEnv" .)) }}
{{- $env = merge $env (fromYaml (include "tollgate.xdsEnv" .)) }}
{{- range $name, $value := .Values.settings }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $env (printf "TOLLGATE_%s" $name) (include "tollgate.envString" $value) }}
{{- end }}
{{- end }}
{{- toYaml $env }}
{{- end }}

{{/* Environment variables read from Secrets (never rendered into a ConfigMap). */}}
{{- define "tollgate.secretEnv" -}}
{{- if .Values.redis.existingSecret }}
- name: REDIS_AUTH
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.passwordKey }}
{{- end }}
{{- if .Values.hashKey.existingSecret }}
- name: TOLLGATE_HASH_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.hashKey.existingSecret }}
      key: {{ .Values.hashKey.key }}
{{- end }}
{{- end }}

{{/*
The rules files: DOMAIN.yaml -> document. Entries are maps or YAML strings; each needs a `domain`, and two
entries may not share one (merge them into one document).
*/}}
{{- define "tollgate.rulesFiles" -}}
{{- $files := dict }}
{{- range $i, $entry := .Values.domains }}
{{- $doc := $entry }}
{{- $text := "" }}
{{- if kindIs "string" $entry }}
{{- $doc = fromYaml $entry }}
{{- if hasKey $doc "Error" }}
{{- fail (printf "domains[%d] is not valid YAML: %s" $i (get $doc "Error")) }}
{{- end }}
{{- $text = $entry }}
{{- else }}
{{- $text = toYaml $entry }}
{{- end }}
{{- if not (and (kindIs "map" $doc) $doc.domain) }}
{{- fail (printf "domains[%d] has no `domain`" $i) }}
{{- end }}
{{- $file := printf "%s.yaml" (regexReplaceAll "[^-._a-zA-Z0-9]" (toString $doc.domain) "_") }}
{{- if and (hasKey $files $file) $.Values.settings.MERGE_DOMAIN_CONFIG }}
{{- $file = printf "%s-%d.yaml" (trimSuffix ".yaml" $file) $i }}
{{- end }}
{{- if hasKey $files $file }}
{{- fail (printf "domains: two entries for domain %q (file %s); merge them into one document or set settings.MERGE_DOMAIN_CONFIG" (toString $doc.domain) $file) }}
{{- end }}
{{- $_ := set $files $file $text }}
{{- end }}
{{- toYaml $files }}
{{- end }}

{{/* The pod security context and container security context, shared by every pod of the chart. */}}
{{- define "tollgate.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}
{{- define "tollgate.securityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/* The dev Redis has its own name label, so Tollgate's selector never matches its pods. */}}
{{- define "tollgate.redisDevSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-redis" (include "tollgate.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.redisDevLabels" -}}
helm.sh/chart: {{ include "tollgate.chart" . }}
{{ include "tollgate.redisDevSelectorLabels" . }}
app.kubernetes.io/component: dev-redis
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tollgate
{{- end }}

{{/*
Labels of the helm test pod. Its own name label: with the Tollgate selector labels the Services would
send it traffic and the Deployment's ReplicaSet would adopt it.
*/}}
{{- define "tollgate.testSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-test" (include "tollgate.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Where the gRPC listener's TLS Secret is mounted. */}}
{{- define "tollgate.grpcTlsDir" -}}
/etc/tollgate/grpc-tls
{{- end }}

{{/* Where the xDS client's TLS Secret is mounted. */}}
{{- define "tollgate.xdsTlsDir" -}}
/etc/tollgate/xds-tls
{{- end }}

{{/* gRPC TLS settings (grpcTls). */}}
{{- define "tollgate.grpcTlsEnv" -}}
{{- $t := .Values.grpcTls }}
{{- if $t.enabled }}
{{- if not $t.secretName }}
{{- fail "grpcTls.enabled needs grpcTls.secretName (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and $t.clientSan (not $t.requireClientCertificate) }}
{{- fail "grpcTls.clientSan needs grpcTls.requireClientCertificate" }}
{{- end }}
{{- $dir := include "tollgate.grpcTlsDir" . }}
TOLLGATE_GRPC_SERVER_USE_TLS: "true"
TOLLGATE_GRPC_SERVER_TLS_CERT: {{ printf "%s/tls.crt" $dir | quote }}
TOLLGATE_GRPC_SERVER_TLS_KEY: {{ printf "%s/tls.key" $dir | quote }}
{{- if $t.requireClientCertificate }}
TOLLGATE_GRPC_CLIENT_TLS_CACERT: {{ printf "%s/ca.crt" $dir | quote }}
{{- end }}
{{- with $t.clientSan }}
TOLLGATE_GRPC_CLIENT_TLS_SAN: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Rules over xDS (xds). */}}
{{- define "tollgate.xdsEnv" -}}
{{- $x := .Values.xds }}
{{- if $x.enabled }}
{{- if not $x.serverUrl }}
{{- fail "xds.enabled needs xds.serverUrl (host:port of the management server)" }}
{{- end }}
TOLLGATE_CONFIG_TYPE: GRPC_XDS_SOTW
TOLLGATE_CONFIG_GRPC_XDS_SERVER_URL: {{ $x.serverUrl | quote }}
TOLLGATE_CONFIG_GRPC_XDS_NODE_ID: {{ $x.nodeId | quote }}
TOLLGATE_FORCE_START_WITHOUT_INITIAL_CONFIG: {{ $x.forceStartWithoutInitialConfig | toString | quote }}
{{- if $x.tlsSecret }}
{{- $dir := include "tollgate.xdsTlsDir" . }}
TOLLGATE_CONFIG_GRPC_XDS_SERVER_USE_TLS: "true"
TOLLGATE_CONFIG_GRPC_XDS_CLIENT_TLS_CERT: {{ printf "%s/tls.crt" $dir | quote }}
TOLLGATE_CONFIG_GRPC_XDS_CLIENT_TLS_KEY: {{ printf "%s/tls.key" $dir | quote }}
TOLLGATE_CONFIG_GRPC_XDS_SERVER_TLS_CACERT: {{ printf "%s/ca.crt" $dir | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
PromQL label matchers selecting this release's series, for the PrometheusRule: prometheusRule.selector,
else the labels this chart's ServiceMonitor gives every sample (the Prometheus Operator names the job after
the scraped Service, RELEASE-tollgate, and adds the namespace). Without either the alerts would select
nothing and never fire, so the render fails instead.
*/}}
{{- define "tollgate.promSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else if .Values.serviceMonitor.enabled }}
{{- printf "job=%q,namespace=%q" (include "tollgate.fullname" .) .Release.Namespace }}
{{- else }}
{{- fail "prometheusRule needs serviceMonitor.enabled (the alerts select the job its scrape produces) or prometheusRule.selector (label matchers for the job that scrapes Tollgate, e.g. job=\"tollgate\",namespace=\"rl\")" }}
{{- end }}
{{- end }}

{{/* An alert's labels: its severity and prometheusRule.alertLabels (severity wins). */}}
{{- define "tollgate.alertLabels" -}}
{{- toYaml (merge (dict "severity" .severity) (deepCopy .root.Values.prometheusRule.alertLabels)) }}
{{- end }}
