{{/*
The vallumd container: a regular container in daemonset mode, a native sidecar (an init container
with restartPolicy: Always) in sidecar mode.
*/}}
{{- define "vallum.vallumd" -}}
- name: vallumd
  image: {{ include "vallum.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq .Values.mode "sidecar" }}
  restartPolicy: Always
  {{- end }}
  ports:
    - name: grpc
      containerPort: {{ .Values.vallumd.grpcPort }}
    - name: metrics
      containerPort: {{ .Values.vallumd.metricsPort }}
  env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: {{ if eq .Values.mode "daemonset" }}status.hostIP{{ else }}status.podIP{{ end }}
    - name: VALLUM_LISTEN
      value: "$(POD_IP):{{ .Values.vallumd.grpcPort }}"
    - name: VALLUM_METRICS_LISTEN
      value: "$(POD_IP):{{ .Values.vallumd.metricsPort }}"
    - name: VALLUM_DB
      value: /var/lib/vallum/vallum.db
    - name: VALLUM_CORES
      value: {{ .Values.vallumd.workers | quote }}
    - name: VALLUM_BARRIER
      value: {{ .Values.vallumd.barrier | quote }}
    - name: VALLUM_SOURCE
      value: {{ if .Values.nfqueue.enabled }}"nfqueue"{{ else }}{{ .Values.vallumd.source | quote }}{{ end }}
    - name: VALLUM_TOKEN_FILE
      value: /etc/vallum/tokens/tokens
    {{- if .Values.metrics.ruleCounters }}
    - name: VALLUM_METRICS_RULE_COUNTERS
      value: "true"
    {{- end }}
    {{- if .Values.tls.enabled }}
    - name: VALLUM_TLS_CERT
      value: /etc/vallum/tls/tls.crt
    - name: VALLUM_TLS_KEY
      value: /etc/vallum/tls/tls.key
    {{- if .Values.tls.clientCA }}
    - name: VALLUM_TLS_CLIENT_CA
      value: /etc/vallum/tls/ca.crt
    {{- end }}
    {{- end }}
    {{- with .Values.vallumd.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if .Values.tls.enabled }}
  # Kubernetes' gRPC probes speak plaintext only: with TLS on, the probes ask the health endpoints
  # of the plaintext metrics listener, which report the same health as grpc.health.v1.
  startupProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 2
    failureThreshold: {{ if eq .Values.mode "daemonset" }}150{{ else }}60{{ end }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 5
    failureThreshold: 2
  livenessProbe:
    httpGet:
      path: /livez
      port: metrics
    periodSeconds: 10
    failureThreshold: 3
  {{- else }}
  # grpc.health.v1 Check(""): NOT_SERVING until the stored revisions are loaded and published.
  startupProbe:
    grpc:
      port: {{ .Values.vallumd.grpcPort }}
    periodSeconds: 2
    failureThreshold: {{ if eq .Values.mode "daemonset" }}150{{ else }}60{{ end }}
  readinessProbe:
    grpc:
      port: {{ .Values.vallumd.grpcPort }}
    periodSeconds: 5
    failureThreshold: 2
  livenessProbe:
    grpc:
      port: {{ .Values.vallumd.grpcPort }}
    periodSeconds: 10
    failureThreshold: 3
  {{- end }}
  securityContext:
    {{- if .Values.nfqueue.enabled }}
    # NFQUEUE needs CAP_NET_ADMIN, effective only for uid 0: root with nothing else.
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["NET_ADMIN"]
    {{- else }}
    {{- toYaml .Values.securityContext | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  volumeMounts:
    - name: vallum-db
      mountPath: /var/lib/vallum
    - name: tmp
      mountPath: /tmp
    - name: tokens
      mountPath: /etc/vallum/tokens
      readOnly: true
    {{- if .Values.tls.enabled }}
    - name: tls
      mountPath: /etc/vallum/tls
      readOnly: true
    {{- end }}
{{- end }}
