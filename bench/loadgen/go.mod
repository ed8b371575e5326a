module github.com/declop/declop/bench/loadgen

go 1.26
