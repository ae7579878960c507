// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3), built
// here because Debian's etcd is too old for kube-apiserver 1.37.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
