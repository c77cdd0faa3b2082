module k8s.io/client-go

go 1.19

require k8s.io/apimachinery v0.26.15

require (
	github.com/go-logr/logr v1.2.3 // indirect
	k8s.io/klog/v2 v2.80.1 // indirect
	k8s.io/utils v0.0.0-20221107191617-1a15be271d1d // indirect
)

replace (
	github.com/go-logr/logr => ./third_party/github.com/go-logr/logr
	k8s.io/apimachinery => ./third_party/k8s.io/apimachinery
	k8s.io/klog/v2 => ./third_party/k8s.io/klog/v2
	k8s.io/utils => ./third_party/k8s.io/utils
)
