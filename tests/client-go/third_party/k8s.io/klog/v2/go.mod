module k8s.io/klog/v2

go 1.13

require github.com/go-logr/logr v1.2.0
