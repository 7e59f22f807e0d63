{{- define "meridian-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name; the release name alone when it already contains the chart name. */}}
{{- define "meridian-agent.fullname" -}}
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

{{- define "meridian-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meridian-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meridian-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "meridian-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: meridian
meridian.io/cluster: {{ include "meridian-agent.cluster" . }}
{{- end }}

{{- define "meridian-agent.cluster" -}}
{{- default .Release.Name .Values.cluster }}
{{- end }}

{{- define "meridian-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "meridian-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meridian-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "meridian-agent.tlsSecret" -}}
{{- default (printf "%s-tls" (include "meridian-agent.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* Namespace the Kubernetes backend creates jobs in. */}}
{{- define "meridian-agent.jobNamespace" -}}
{{- default .Release.Namespace .Values.kubernetes.namespace }}
{{- end }}

{{/*
Paths inside the container. The image's default config path (deploy/docker/agent.Dockerfile) is
the same; tests/tests/helm.rs checks that they agree.
*/}}
{{- define "meridian-agent.configDir" -}}/etc/meridian/config{{- end }}
{{- define "meridian-agent.configPath" -}}/etc/meridian/config/agent.yaml{{- end }}
{{- define "meridian-agent.tlsDir" -}}/etc/meridian/tls{{- end }}

{{/* Refuses values the chart cannot run with, naming the value and what to do. */}}
{{- define "meridian-agent.validate" -}}
{{- if not (has .Values.backend (list "kubernetes" "slurm" "builtin")) }}
{{- fail (printf "backend: %q is not one of kubernetes, slurm, builtin" .Values.backend) }}
{{- end }}
{{- if and (eq .Values.backend "kubernetes") (not (has .Values.kubernetes.mode (list "volcano" "kueue"))) }}
{{- fail (printf "kubernetes.mode: %q is not one of volcano, kueue" .Values.kubernetes.mode) }}
{{- end }}
{{- if not .Values.region }}
{{- fail "region: name the cluster's region (as in the gateway's network table)" }}
{{- end }}
{{- if eq .Values.backend "slurm" }}
{{- /* The default of the agent's slurm.workDir (member-agent/src/backend/slurm/config.rs). */}}
{{- $workDir := default "/var/lib/meridian-agent/slurm" .Values.slurm.workDir }}
{{- $mounted := false }}
{{- range .Values.extraVolumeMounts }}
{{- if or (eq .mountPath $workDir) (hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $workDir) }}
{{- $mounted = true }}
{{- end }}
{{- end }}
{{- if not $mounted }}
{{- fail (printf "slurm.workDir: %s must be on a volume the compute nodes share; mount one there with extraVolumes and extraVolumeMounts (the container's root filesystem is read-only)" $workDir) }}
{{- end }}
{{- end }}
{{- range $key := list "cluster" "region" "tier" "gateway" "tls" "insecure" "backend" "kubernetes" "slurm" "metrics" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s: set by the chart; use the chart's top-level `%s` value instead" $key $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The agent config file: `config` from the values plus what the chart owns. */}}
{{- define "meridian-agent.config" -}}
{{- $config := deepCopy (default (dict) .Values.config) }}
{{- $_ := set $config "cluster" (include "meridian-agent.cluster" .) }}
{{- $_ := set $config "region" .Values.region }}
{{- $_ := set $config "tier" .Values.tier }}
{{- $_ := set $config "gateway" .Values.gateway }}
{{- $_ := set $config "backend" .Values.backend }}
{{- if .Values.tls.enabled }}
{{- $tlsDir := include "meridian-agent.tlsDir" . }}
{{- $_ := set $config "tls" (dict "ca" (printf "%s/%s" $tlsDir .Values.tls.caKey) "cert" (printf "%s/%s" $tlsDir .Values.tls.certKey) "key" (printf "%s/%s" $tlsDir .Values.tls.keyKey)) }}
{{- else }}
{{- $_ := set $config "insecure" true }}
{{- end }}
{{- if eq .Values.backend "kubernetes" }}
{{- $kubernetes := deepCopy .Values.kubernetes }}
{{- $_ := set $kubernetes "namespace" (include "meridian-agent.jobNamespace" .) }}
{{- if not $kubernetes.startLockCheck }}
{{- $_ := unset $kubernetes "startLockCheck" }}
{{- end }}
{{- $_ := set $config "kubernetes" $kubernetes }}
{{- else if eq .Values.backend "slurm" }}
{{- $_ := set $config "slurm" (default (dict) .Values.slurm) }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $_ := set $config "metrics" (dict "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port))) }}
{{- end }}
{{- toYaml $config }}
{{- end }}
