{{/*
Names and labels shared by every template, as `helm create` lays them out.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "vallum.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it already contains the chart
name, else RELEASE-CHART; cut to 63 characters (a DNS label).
*/}}
{{- define "vallum.fullname" -}}
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

{{/* CHART-VERSION, for the helm.sh/chart label. */}}
{{- define "vallum.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select the pods (stable across upgrades: never add the version here). */}}
{{- define "vallum.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vallum.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every object. */}}
{{- define "vallum.labels" -}}
helm.sh/chart: {{ include "vallum.chart" . }}
{{ include "vallum.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vallum
app.kubernetes.io/component: {{ if eq .Values.mode "daemonset" }}node-agent{{ else }}sidecar{{ end }}
{{- end }}

{{/* The image of vallumd. */}}
{{- define "vallum.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The filter chains steered into NFQUEUE. */}}
{{- define "vallum.steerHooks" -}}
{{- if .Values.nfqueue.hooks }}{{ .Values.nfqueue.hooks }}{{ else if eq .Values.mode "daemonset" }}FORWARD{{ else }}INPUT OUTPUT{{ end }}
{{- end }}

{{/*
Where the store lives: persistence.type, or when it is empty the mode's default: hostPath in
daemonset mode (the node keeps the store across pod restarts and upgrades), emptyDir in sidecar
mode (replicas share no volume).
*/}}
{{- define "vallum.persistenceType" -}}
{{- if .Values.persistence.type }}{{ .Values.persistence.type }}{{ else if eq .Values.mode "daemonset" }}hostPath{{ else }}emptyDir{{ end }}
{{- end }}

{{/*
Whether the cluster serves the Prometheus Operator's API (monitoring.coreos.com/v1): the
ServiceMonitor and PrometheusRule are rendered only then, so the chart installs on a cluster
without the operator's CRDs. `helm template` asks no cluster: pass
`--api-versions monitoring.coreos.com/v1` to render them.
*/}}
{{- define "vallum.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}
