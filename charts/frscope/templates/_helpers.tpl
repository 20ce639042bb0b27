{{/* Names */}}
{{- define "frscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "frscope.fullname" -}}
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

{{- define "frscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "frscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "frscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "frscope.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "frscope.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "frscope.sidecarCaSecretName" -}}
{{- printf "%s-sidecar-ca" (include "frscope.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels. Selector labels never change across upgrades (Deployment selectors are immutable). */}}
{{- define "frscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "frscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* For pod templates: no helm.sh/chart (a chart bump must not restart pods by itself). */}}
{{- define "frscope.podLabels" -}}
{{ include "frscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: frscope
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "frscope.labels" -}}
helm.sh/chart: {{ include "frscope.chart" . }}
{{ include "frscope.podLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Images */}}
{{- define "frscope.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "frscope.sidecarImage" -}}
{{- $repo := default .Values.image.repository .Values.sidecar.image.repository }}
{{- if .Values.sidecar.image.digest }}
{{- printf "%s@%s" $repo .Values.sidecar.image.digest }}
{{- else if or .Values.sidecar.image.repository .Values.sidecar.image.tag }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.sidecar.image.tag) }}
{{- else }}
{{- include "frscope.image" . }}
{{- end }}
{{- end }}

{{/* Namespaces the training pods live in (NetworkPolicy, PodMonitor); empty list = all. */}}
{{- define "frscope.trainingNamespaces" -}}
{{- toJson (default .Values.operator.watchNamespaces .Values.networkPolicy.namespaces) }}
{{- end }}

{{/* The Prometheus job name of the sidecars' PodMonitor (prometheus-operator: <namespace>/<name>). */}}
{{- define "frscope.sidecarJob" -}}
{{- printf "%s/%s-sidecars" .Release.Namespace (include "frscope.fullname" .) }}
{{- end }}

{{/* The Prometheus job name of the operator's ServiceMonitor (the Service's name). */}}
{{- define "frscope.operatorJob" -}}
{{- include "frscope.fullname" . }}
{{- end }}

{{/* The API group of FlightRecorderReport, read from the CRD shipped in crds/ (frscope.io, the operator's REPORT_GROUP, if absent). */}}
{{- define "frscope.reportGroup" -}}
{{- $crd := .Files.Get "crds/flightrecorderreport.yaml" | fromYaml }}
{{- dig "spec" "group" "frscope.io" $crd }}
{{- end }}

{{/* The operator's namespaced permissions: in its ClusterRole, or in a Role per watched namespace. */}}
{{- define "frscope.namespacedRules" }}
  {{- range $kind := list "pytorchjob" "trainjob" "jobset" }}
  {{- if index $.Values.operator.jobKinds $kind }}
  {{- $group := get (dict "pytorchjob" "kubeflow.org" "trainjob" "trainer.kubeflow.org" "jobset" "jobset.x-k8s.io") $kind }}
  # Watching {{ $kind }}s (operator.jobKinds.{{ $kind }}; kopf event handlers). Read-only: frscope's
  # bookkeeping (which incidents are diagnosed) lives in its own FlightRecorderReports.
  - apiGroups: [{{ $group | quote }}]
    resources: [{{ printf "%ss" $kind | quote }}]
    verbs: ["get", "list", "watch"]
  # The diagnosis condition in the {{ $kind }}'s status.conditions, through the status subresource:
  # the only write on the job.
  - apiGroups: [{{ $group | quote }}]
    resources: [{{ printf "%ss/status" $kind | quote }}]
    verbs: ["patch"]
  {{- end }}
  {{- end }}
  # The job's pods: where each rank runs, the sidecar's address (pod IP + named port), container
  # termination messages (the watchdog's timeout message). Read-only; no exec, no logs.
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch"]
  # Events on the job (the diagnosis, unreachable sidecars) and kopf's own handler events.
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create", "patch"]
  # The same Events through the newer events.k8s.io API (clients that post events/v1).
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
  # The full report: frscope's own FlightRecorderReport, created once per incident, owned by the job.
  - apiGroups: [{{ include "frscope.reportGroup" . | quote }}]
    resources: ["flightrecorderreports"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}

{{- /* The action policy's namespaced rules (templates/rbac-actions.yaml): only what each allowed action uses. */}}
{{- define "frscope.actionRules" }}
  {{- $kinds := .Values.operator.jobKinds }}
  {{- if has "restart" .Values.actions.allow }}
  # restart: delete every pod of a hung job (each by uid); its controller recreates them (the training
  # operator; for a TrainJob or JobSet the Job controller, or the JobSet's failurePolicy).
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["delete"]
  {{- if $kinds.trainjob }}
  # restart of a TrainJob: read the JobSet it owns (whose failurePolicy decides if the pods come back).
  - apiGroups: ["jobset.x-k8s.io"]
    resources: ["jobsets"]
    verbs: ["get"]
  {{- end }}
  {{- end }}
  {{- if has "stop" .Values.actions.allow }}
  {{- range $kind := list "pytorchjob" "trainjob" "jobset" }}
  {{- if index $kinds $kind }}
  {{- $group := get (dict "pytorchjob" "kubeflow.org" "trainjob" "trainer.kubeflow.org" "jobset" "jobset.x-k8s.io") $kind }}
  {{- $field := get (dict "pytorchjob" "spec.runPolicy.suspend" "trainjob" "spec.suspend" "jobset" "spec.suspend") $kind }}
  # stop: {{ $field }} of a hung {{ $kind }}, with the verdict as an annotation beside it.
  - apiGroups: [{{ $group | quote }}]
    resources: [{{ printf "%ss" $kind | quote }}]
    verbs: ["patch"]
  {{- end }}
  {{- end }}
  # stop of a job Kueue queues (label kueue.x-k8s.io/queue-name): spec.active false on its Workload
  # (found by its ownerReference to the job); Kueue then suspends the job and does not re-admit it.
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["workloads"]
    verbs: ["list", "patch"]
  {{- end }}
{{- end }}

{{/* The sidecars' NetworkPolicy (templates/networkpolicy.yaml): one rule, the sidecar port of opted-in pods from
  the operator and the Prometheus peers. It only allows: next to a namespace's own policies (default-deny) it
  opens that port to those peers and nothing else; there is no rule without `from`. */}}
{{- define "frscope.sidecarPolicySpec" -}}
podSelector:
  matchLabels:
    {{ .Values.webhook.injectLabel.key }}: {{ .Values.webhook.injectLabel.value | quote }}
policyTypes: ["Ingress"]
ingress:
  - from:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: {{ .Release.Namespace }}
        podSelector:
          matchLabels:
            {{- include "frscope.selectorLabels" . | nindent 12 }}
            app.kubernetes.io/component: operator
      {{- with .Values.networkPolicy.prometheus }}
      {{- if or .namespaceSelector .podSelector }}
      - {{- with .namespaceSelector }}
        namespaceSelector:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .podSelector }}
        podSelector:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      {{- end }}
      {{- end }}
    ports:
      - protocol: TCP
        port: {{ int .Values.sidecar.port }}
{{- end }}

{{- define "frscope.sidecarPolicyRole" -}}
{{- printf "%s-operator-sidecar-policy" (include "frscope.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* FRSCOPE_SIDECAR_NETWORK_POLICY: the policy above as the operator writes it into the namespaces of opted-in pods
  that have policies of their own (networkPolicy.enabled, sidecars.addToNamespacesWithPolicies, no training
  namespaces named); empty otherwise. */}}
{{- define "frscope.sidecarPolicyJson" -}}
{{- if and .Values.networkPolicy.enabled .Values.networkPolicy.sidecars.addToNamespacesWithPolicies (not .Values.networkPolicy.namespaces) -}}
{{- $labels := merge (dict "app.kubernetes.io/component" "sidecar" "app.kubernetes.io/managed-by" "frscope-operator") (fromYaml (include "frscope.labels" .)) -}}
{{- $meta := dict "name" (printf "%s-sidecar" (include "frscope.fullname" .)) "labels" $labels -}}
{{- $policy := dict "metadata" $meta "spec" (fromYaml (include "frscope.sidecarPolicySpec" .)) -}}
{{- dict "owner" (dict "name" (include "frscope.sidecarPolicyRole" .)) "policy" $policy | toJson -}}
{{- end -}}
{{- end }}
