module frscope.dev/npd

go 1.26

require k8s.io/node-problem-detector v1.34.0
