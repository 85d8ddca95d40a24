"""A real Kubernetes control plane for the tests (envtest-style), from ``../shared/envtest``.

etcd, kube-apiserver (token auth, RBAC, Pod Security admission), kube-controller-manager (Jobs,
garbage collection), the JobSet controller, the Kubeflow Trainer v2.3 controller and the Training
Operator v1.9 with their webhooks, all on loopback; the official CRDs and webhook configurations
from ``../shared/reference``. No scheduler and no kubelet: ``kubelet.FakeKubelet`` plays the
kubelet through the API (binds pods to its Node, patches their status, serves their logs over
HTTPS to the API server's ``pods/log`` proxy, finishes graceful deletions).
"""
