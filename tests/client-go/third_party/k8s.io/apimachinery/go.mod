module k8s.io/apimachinery

go 1.19

require (
	k8s.io/klog/v2 v2.80.1
	k8s.io/utils v0.0.0-20221107191617-1a15be271d1d
)

require github.com/go-logr/logr v1.2.3 // indirect
