{{/* The chart's names and labels. */}}
{{- define "vmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vmon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "vmon.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "vmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vmon.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secrets the bootstrap reads: the join token (key token) and the admin key (key key). */}}
{{- define "vmon.tokenSecret" -}}
{{- .Values.bootstrap.existingTokenSecret | default (printf "%s-join-token" (include "vmon.fullname" .)) }}
{{- end }}

{{- define "vmon.adminKeySecret" -}}
{{- .Values.bootstrap.existingAdminKeySecret | default (printf "%s-admin-key" (include "vmon.fullname" .)) }}
{{- end }}

{{/* The drivers' cluster endpoint as nodes reach it: the Service's name, which the drivers'
certificate carries (it is their --advertise). */}}
{{- define "vmon.clusterHost" -}}
{{ include "vmon.fullname" . }}-cluster.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The store's settings, for drivers and nodes alike. */}}
{{- define "vmon.storeEnv" -}}
{{- if .Values.store.existingSecret }}
- name: VMON_STORE
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.existingSecret }}
      key: {{ .Values.store.urlKey }}
{{- range $env, $key := .Values.store.awsKeys }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.store.existingSecret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- else if .Values.store.url }}
- name: VMON_STORE
  value: {{ .Values.store.url | quote }}
{{- else }}
{{- fail "store.url or store.existingSecret is required: the drivers and nodes share templates through a store (s3://bucket/prefix, or a directory on store.volume)" }}
{{- end }}
{{- end }}

{{- define "vmon.storeVolumeMount" -}}
{{- if .Values.store.volume.enabled }}
- name: store
  mountPath: {{ .Values.store.volume.mountPath }}
{{- end }}
{{- end }}

{{- define "vmon.storeVolume" -}}
{{- if .Values.store.volume.enabled }}
- name: store
  persistentVolumeClaim:
    claimName: {{ required "store.volume.existingClaim: a ReadWriteMany claim every driver and node mounts" .Values.store.volume.existingClaim }}
{{- end }}
{{- end }}
