{{/* Names, labels and shared pieces of the Shadowpod chart. */}}

{{- define "shadowpod.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shadowpod.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shadowpod.operator.fullname" -}}
{{- printf "%s-operator" (include "shadowpod.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shadowpod.gateway.fullname" -}}
{{- printf "%s-gateway" (include "shadowpod.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shadowpod.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "shadowpod.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shadowpod
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "shadowpod.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shadowpod.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "shadowpod.componentLabels" -}}
{{ include "shadowpod.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "shadowpod.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "shadowpod.operator.fullname" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name: name an existing ServiceAccount when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shadowpod.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "shadowpod.gateway.fullname" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- required "gateway.serviceAccount.name: name an existing ServiceAccount when gateway.serviceAccount.create is false" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shadowpod.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "shadowpod.gateway.url" -}}
{{- printf "http://%s.%s.svc:%v" (include "shadowpod.gateway.fullname" .) .Release.Namespace .Values.gateway.port -}}
{{- end -}}

{{- define "shadowpod.controlTokenSecret" -}}
{{- default (printf "%s-control-token" (include "shadowpod.fullname" .)) .Values.gateway.controlToken.existingSecret -}}
{{- end -}}

{{- define "shadowpod.sqliteClaim" -}}
{{- default (printf "%s-journal" (include "shadowpod.gateway.fullname" .)) .Values.gateway.journal.sqlite.existingClaim -}}
{{- end -}}

{{/* The labels the operator gives agent pods (operator/shadowpod/kube/names.py). */}}
{{- define "shadowpod.agentSelector" -}}
app.kubernetes.io/name: shadowpod-agent
app.kubernetes.io/managed-by: shadowpod-operator
{{- end -}}

{{/* Cross-field checks the schema cannot say well; each message says what to change. */}}
{{- define "shadowpod.validate" -}}
{{- $journal := .Values.gateway.journal -}}
{{- if and (eq $journal.backend "sqlite") (gt (int .Values.gateway.replicas) 1) -}}
{{- fail (printf "gateway.replicas is %v but the SQLite journal is one file on one volume: set gateway.replicas to 1, or gateway.journal.backend to postgresql with gateway.journal.postgresql.existingSecret" .Values.gateway.replicas) -}}
{{- end -}}
{{- if and (eq $journal.backend "postgresql") (not $journal.postgresql.existingSecret) -}}
{{- fail "gateway.journal.backend is postgresql but gateway.journal.postgresql.existingSecret is empty: create a Secret with the journal URL (postgresql://user:password@host/db) under the key gateway.journal.postgresql.key and name it there" -}}
{{- end -}}
{{- end -}}

{{/*
A histogram bucket bound as Prometheus' client libraries write it in an `le` label:
1 → "1.0", 0.25 → "0.25".
*/}}
{{- define "shadowpod.leLabel" -}}
{{- $bound := float64 . -}}
{{- if eq $bound (floor $bound) -}}{{ printf "%.1f" $bound }}{{- else -}}{{ $bound }}{{- end -}}
{{- end -}}
