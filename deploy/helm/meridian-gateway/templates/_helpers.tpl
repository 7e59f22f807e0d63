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

{{/* Refuses values the chart cannot run with, naming the value and what to do. */}}
{{- define "meridian-gateway.validate" -}}
{{- if ne .Values.store.kind "embedded" }}
{{- fail (printf "store.kind: %q is not supported yet; the gateway has the `embedded` store only (the etcd store will be configured here once it exists)" .Values.store.kind) }}
{{- end }}
{{- if and .Values.auth.jwt.enabled (not .Values.auth.jwt.jwksSecret) }}
{{- fail "auth.jwt.jwksSecret: name the Secret holding the JSON Web Key Set (or set auth.jwt.enabled=false)" }}
{{- end }}
{{- if and .Values.auth.jwt.enabled (not (and .Values.auth.jwt.issuer .Values.auth.jwt.audience)) }}
{{- fail "auth.jwt.issuer, auth.jwt.audience: both are needed with auth.jwt.enabled=true" }}
{{- end }}
{{- range $key := list "listen" "grpcListen" "dataDir" "tls" "insecure" "auth" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s: set by the chart; use the chart's own values (ports, tls, auth, persistence) instead" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway config file: `config` from the values plus what the chart owns. */}}
{{- define "meridian-gateway.config" -}}
{{- $config := deepCopy (default (dict) .Values.config) }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%d" (int .Values.ports.rest)) }}
{{- $_ := set $config "grpcListen" (printf "0.0.0.0:%d" (int .Values.ports.grpc)) }}
{{- $_ := set $config "dataDir" (include "meridian-gateway.dataDir" .) }}
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
