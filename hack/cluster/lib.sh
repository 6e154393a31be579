# Shared by hack/cluster/*: versions, paths and addresses of the one test cluster a
# machine runs. Sourced, not run.
# shellcheck shell=bash

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.2
CNI_PLUGINS_VERSION=v1.10.0
COREDNS_VERSION=v1.15.0
# Built from Kubernetes' build/pause/linux/pause.c (no registry can be pulled from).
PAUSE_IMAGE=shadowpod.dev/pause:3.10
COREDNS_IMAGE=shadowpod.dev/coredns:$COREDNS_VERSION

KUBE_CACHE="${SHADOWPOD_KUBE_CACHE:-$HOME/.cache/shadowpod/kube-$KUBE_VERSION}"
BIN="$KUBE_CACHE/bin"
# Everything a running cluster has: certificates, etcd's data, each node's kubelet and
# containerd roots, logs and pid files. `down` removes it all.
STATE="${SHADOWPOD_CLUSTER_STATE:-/var/lib/shadowpod-cluster}"
RUN="$STATE/run"
LOGS="$STATE/log"
KUBECONFIG_PATH="$STATE/admin.kubeconfig"

# Addresses. Nothing listens beyond this machine: every server binds an address on the
# loopback interface — 127.0.0.1, or, for what pods must reach (the API server, the
# kubelets), one of 10.87.0.0/24 added to `lo` by `up` (pods' packets reach the host
# through their bridge; nothing outside has a route to them).
APISERVER_IP=10.87.0.1
NODES=(node-1 node-2)
# node-N: address 10.87.0.(N+1) on lo, pods in 10.244.N.0/24 on bridge shadowpod-brN.
node_ip() { echo "10.87.0.$((${1#node-} + 1))"; }
node_pod_cidr() { echo "10.244.${1#node-}.0/24"; }
node_bridge() { echo "shadowpod-br${1#node-}"; }
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
ETCD_PORT=2379
APISERVER_PORT=6443
# A comment on every iptables rule we add, so that `down` removes exactly those.
RULE_TAG=shadowpod-cluster

die() {
    echo "error: $*" >&2
    exit 1
}
say() { echo "cluster: $*" >&2; }

kubectl_() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
