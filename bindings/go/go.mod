module github.com/libflashattn/libflashattn/bindings/go

go 1.18
