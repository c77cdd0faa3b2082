module libwq/tools/goqueue

go 1.19
