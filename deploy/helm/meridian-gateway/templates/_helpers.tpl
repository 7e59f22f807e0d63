{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "meridian-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name; the release name alone when it already contains the chart name. */}}
{{- define "meridian-gateway.fullname" -}}
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

{{- define "meridian-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meridian-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meridian-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "meridian-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: meridian
{{- end }}

{{- define "meridian-gateway.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "meridian-gateway.tlsSecret" -}}
{{- default (printf "%s-tls" (include "meridian-gateway.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/*
Paths inside the container. The image's default command reads the same config path
(deploy/docker/gateway.Dockerfile); tests/tests/helm.rs checks that they agree.
*/}}
{{- define "meridian-gateway.configDir" -}}/etc/meridian/config{{- end }}
{{- define "meridian-gateway.configPath" -}}/etc/meridian/config/gateway.yaml{{- end }}
{{- define "meridian-gateway.dataDir" -}}/var/lib/meridian{{- end }}
{{- define "meridian-gateway.tlsDir" -}}/etc/meridian/tls{{- end }}
{{- define "meridian-gateway.tokensDir" -}}/etc/meridian/auth/tokens{{- end }}
{{- define "meridian-gateway.jwksDir" -}}/etc/meridian/auth/jwks{{- end }}
{{- define "meridian-gateway.configTemplateDir" -}}/etc/meridian/config-template{{- end }}
{{- define "meridian-gateway.secretsDir" -}}/etc/meridian/secrets{{- end }}
{{- define "meridian-gateway.secretsSourceDir" -}}/etc/meridian/secrets-source{{- end }}
{{- define "meridian-gateway.etcdTlsDir" -}}/etc/meridian/etcd/tls{{- end }}
{{- define "meridian-gateway.etcdAuthDir" -}}/etc/meridian/etcd/auth{{- end }}

{{/* "true" when the gateways keep their state in etcd (several replicas, one elected leader). */}}
{{- define "meridian-gateway.etcd" -}}
{{- if eq .Values.store.kind "etcd" }}true{{ end }}
{{- end }}

{{/* Gateway pods: the `replicas` value, or 3 with etcd and 1 with the embedded store. */}}
{{- define "meridian-gateway.replicas" -}}
{{- if kindIs "invalid" .Values.replicas }}{{ ternary 3 1 (eq .Values.store.kind "etcd") }}{{ else }}{{ int .Values.replicas }}{{ end }}
{{- end }}

{{/*
The Secret holding the secrets key file: `secrets.existingSecret`; with etcd, "<fullname>-secrets"
when empty (every gateway needs the same key); with the embedded store, none when empty (the
gateway creates the key on its volume).
*/}}
{{- define "meridian-gateway.secretsSecret" -}}
{{- if .Values.secrets.existingSecret }}{{ .Values.secrets.existingSecret }}
{{- else if eq .Values.store.kind "etcd" }}{{ printf "%s-secrets" (include "meridian-gateway.fullname" .) }}
{{- end }}
{{- end }}

{{- define "meridian-gateway.etcdTlsSecret" -}}
{{- default (printf "%s-etcd-tls" (include "meridian-gateway.fullname" .)) .Values.store.etcd.tls.existingSecret }}
{{- end }}

{{/*
"true" when an init container prepares the pod's files: the config with this pod's name in it
(`{pod}` in the ConfigMap's text) and the secrets key copied with mode 0600 (the gateway refuses a
key file others may read, and a Secret volume with an fsGroup is group-readable).
*/}}
{{- define "meridian-gateway.prepared" -}}
{{- if or (eq .Values.store.kind "etcd") (include "meridian-gateway.secretsSecret" .) }}true{{ end }}
{{- end }}

{{/* The host a gateway advertises when it leads; `{pod}` is replaced by the pod's name. */}}
{{- define "meridian-gateway.advertiseHost" -}}
{{- default (printf "{pod}.%s-headless.%s.svc.%s" (include "meridian-gateway.fullname" .) .Release.Namespace .Values.ha.clusterDomain) .Values.ha.advertiseHost }}
{{- end }}

{{/* Refuses values the chart cannot run with, naming the value and what to do. */}}
{{- define "meridian-gateway.validate" -}}
{{- if not (has .Values.store.kind (list "embedded" "etcd")) }}
{{- fail (printf "store.kind: %q is not a store; use `embedded` (one gateway, the default) or `etcd` (several gateways, one elected leader)" .Values.store.kind) }}
{{- end }}
{{- $replicas := int (include "meridian-gateway.replicas" .) }}
{{- if and (eq .Values.store.kind "embedded") (gt $replicas 1) }}
{{- fail (printf "replicas: %d with store.kind embedded: the embedded store has one writer (the gateway locks its directory), so it runs exactly one replica; for several gateways set store.kind=etcd with store.etcd.endpoints (docs/operations.md#high-availability)" $replicas) }}
{{- end }}
{{- if lt $replicas 1 }}
{{- fail (printf "replicas: %d; at least 1 (3 for a highly available gateway on etcd)" $replicas) }}
{{- end }}
{{- if eq .Values.store.kind "etcd" }}
{{- $etcd := .Values.store.etcd }}
{{- if not $etcd.endpoints }}
{{- fail "store.etcd.endpoints: name the client URLs of every etcd member (e.g. [https://etcd-0.etcd:2379, https://etcd-1.etcd:2379, https://etcd-2.etcd:2379]); required with store.kind=etcd" }}
{{- end }}
{{- range $i, $endpoint := $etcd.endpoints }}
{{- $https := hasPrefix "https://" $endpoint }}
{{- if not (or $https (hasPrefix "http://" $endpoint)) }}
{{- fail (printf "store.etcd.endpoints[%d]: %q must start with https:// (or http:// without store.etcd.tls)" $i $endpoint) }}
{{- end }}
{{- if ne $https $etcd.tls.enabled }}
{{- fail (printf "store.etcd.endpoints[%d]: %q; use https:// endpoints exactly when store.etcd.tls.enabled=true" $i $endpoint) }}
{{- end }}
{{- end }}
{{- if and $etcd.username (not $etcd.passwordSecret) }}
{{- fail "store.etcd.passwordSecret: name the Secret holding the etcd user's password (key store.etcd.passwordKey), or leave store.etcd.username empty" }}
{{- end }}
{{- if and $etcd.passwordSecret (not $etcd.username) }}
{{- fail "store.etcd.username: set the etcd user whose password store.etcd.passwordSecret holds" }}
{{- end }}
{{- if and .Values.ha.advertiseHost (not (contains "{pod}" .Values.ha.advertiseHost)) }}
{{- fail (printf "ha.advertiseHost: %q must contain {pod} (each gateway advertises its own address, e.g. {pod}.gw.example.com)" .Values.ha.advertiseHost) }}
{{- end }}
{{- end }}
{{- if and .Values.auth.jwt.enabled (not .Values.auth.jwt.jwksSecret) }}
{{- fail "auth.jwt.jwksSecret: name the Secret holding the JSON Web Key Set (or set auth.jwt.enabled=false)" }}
{{- end }}
{{- if and .Values.auth.jwt.enabled (not (and .Values.auth.jwt.issuer .Values.auth.jwt.audience)) }}
{{- fail "auth.jwt.issuer, auth.jwt.audience: both are needed with auth.jwt.enabled=true" }}
{{- end }}
{{- range $key := list "listen" "grpcListen" "dataDir" "tls" "insecure" "auth" "store" "secrets" "ha" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s: set by the chart; use the chart's own values (ports, tls, auth, persistence, store, secrets, ha) instead" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway config file: `config` from the values plus what the chart owns. */}}
{{- define "meridian-gateway.config" -}}
{{- $config := deepCopy (default (dict) .Values.config) }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%d" (int .Values.ports.rest)) }}
{{- $_ := set $config "grpcListen" (printf "0.0.0.0:%d" (int .Values.ports.grpc)) }}
{{- if eq .Values.store.kind "etcd" }}
{{- $etcd := .Values.store.etcd }}
{{- $store := dict "endpoints" $etcd.endpoints "prefix" $etcd.prefix "maxTxnOps" (int $etcd.maxTxnOps) "maxRequestBytes" (int $etcd.maxRequestBytes) }}
{{- if $etcd.tls.enabled }}
{{- $etcdTlsDir := include "meridian-gateway.etcdTlsDir" . }}
{{- $tls := dict "ca" (printf "%s/%s" $etcdTlsDir $etcd.tls.caKey) }}
{{- if $etcd.tls.certKey }}
{{- $_ := set $tls "cert" (printf "%s/%s" $etcdTlsDir $etcd.tls.certKey) }}
{{- $_ := set $tls "key" (printf "%s/%s" $etcdTlsDir $etcd.tls.keyKey) }}
{{- end }}
{{- $_ := set $store "tls" $tls }}
{{- end }}
{{- if $etcd.username }}
{{- $_ := set $store "username" $etcd.username }}
{{- $_ := set $store "passwordFile" (printf "%s/%s" (include "meridian-gateway.etcdAuthDir" .) $etcd.passwordKey) }}
{{- end }}
{{- $_ := set $config "store" (dict "kind" "etcd" "etcd" $store) }}
{{- $scheme := ternary "https" "http" .Values.tls.enabled }}
{{- $host := include "meridian-gateway.advertiseHost" . }}
{{- $_ := set $config "ha" (dict "name" "{pod}" "advertiseRest" (printf "%s://%s:%d" $scheme $host (int .Values.ports.rest)) "advertiseGrpc" (printf "%s://%s:%d" $scheme $host (int .Values.ports.grpc)) "leaseTtl" .Values.ha.leaseTtl "stepDownMargin" .Values.ha.stepDownMargin) }}
{{- else }}
{{- $_ := set $config "dataDir" (include "meridian-gateway.dataDir" .) }}
{{- end }}
{{- with include "meridian-gateway.secretsSecret" . }}
{{- $_ := set $config "secrets" (dict "keyFile" (printf "%s/%s" (include "meridian-gateway.secretsDir" $) $.Values.secrets.key)) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $tlsDir := include "meridian-gateway.tlsDir" . }}
{{- $_ := set $config "tls" (dict "cert" (printf "%s/%s" $tlsDir .Values.tls.certKey) "key" (printf "%s/%s" $tlsDir .Values.tls.keyKey) "clientCa" (printf "%s/%s" $tlsDir .Values.tls.clientCaKey)) }}
{{- else }}
{{- $_ := set $config "insecure" true }}
{{- end }}
{{- if or .Values.auth.tokensSecret .Values.auth.jwt.enabled }}
{{- $auth := dict "reloadInterval" .Values.auth.reloadInterval }}
{{- if .Values.auth.tokensSecret }}
{{- $_ := set $auth "tokensFile" (printf "%s/%s" (include "meridian-gateway.tokensDir" .) .Values.auth.tokensKey) }}
{{- end }}
{{- if .Values.auth.jwt.enabled }}
{{- $_ := set $auth "jwt" (dict "issuer" .Values.auth.jwt.issuer "audience" .Values.auth.jwt.audience "jwksFile" (printf "%s/%s" (include "meridian-gateway.jwksDir" .) .Values.auth.jwt.jwksKey)) }}
{{- end }}
{{- $_ := set $config "auth" $auth }}
{{- end }}
{{- toYaml $config }}
{{- end }}
