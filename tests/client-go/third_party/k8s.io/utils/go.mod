module k8s.io/utils

go 1.18
