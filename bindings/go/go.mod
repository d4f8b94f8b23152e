module flashattn

go 1.18
